"""The server's side of the informed-adversary game: trials, the prior-aware guess, the verdicts.

Per trial the attacker sends the global model to ``BeginInformedTrial``, receives the public
candidates, the known records and the user's update, replays the user's noise-free update for
every candidate (:func:`noise_free_replay`: the published protocol and clipping, the noise
set to zero, Poisson sampling replaced by its expectation) and lets
:class:`~fedleak.attacks.prior_aware.PriorAwareAttack` guess; ``ScoreInformedGuess`` returns
the victim's verdict. Repeated trials give a success rate with its Clopper–Pearson interval,
written beside the reconstruction-robustness bound of the published mechanism at κ = 1/N
(:mod:`fedleak.auditing.reconstruction.bounds`) to ``metrics.json`` and a picture.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import torch
from tqdm import tqdm

from fedleak import __version__
from fedleak.attacks.prior_aware import InformedObservation, PriorAwareAttack
from fedleak.auditing.game_statistics import SuccessRate, success_rate
from fedleak.auditing.reconstruction.bounds import ReconstructionBound, reconstruction_bound
from fedleak.defenses import DefenseChain, build_chain
from fedleak.defenses.mechanism import DECLARED_PREFIX
from fedleak.harness.attacker.client import VictimClient, VictimError
from fedleak.harness.attacker.described import (
    dataset_info,
    defense_specs,
    server_model,
    victim_protocol,
)
from fedleak.harness.attacker.games.bound_pictures import plot_game
from fedleak.harness.attacker.records import METRICS_NAME, to_json, write_json
from fedleak.harness.federated.defended_update import defended_update
from fedleak.harness.federated.protocol import FEDAVG
from fedleak.harness.metrics.success_bounds import round_mechanism
from fedleak.harness.wire.codec import decode_tensor
from fedleak.harness.wire.protocol_spec import protocol_from_pb
from fedleak.harness.zoo.datasets import normalize
from fedleak.v1 import victim_pb2 as pb

PICTURE_NAME = "informed-adversary.png"
#: defenses whose randomness the replay leaves out (the noise is the mechanism's secret)
_NOISE_FREE = {"dpsgd": {"noise-multiplier": "0", "poisson": "false"}, "noise": {"sigma": "0"}}


@dataclass
class TrialRecord:
    """One trial: the guess, the victim's verdict, the mechanism it ran."""

    trial_id: str
    guess: int
    success: bool
    margin: float
    candidates: int
    known_records: int
    noise_multiplier: float | None
    sample_rate: float | None
    dp_steps: int | None
    wall_time_s: float


@dataclass
class GameSummary:
    """The success rate with its interval beside the bound at the same mechanism."""

    trials: int
    successes: int
    success_rate: float
    ci_low: float
    ci_high: float
    confidence: float
    kappa: float
    bound: float | None
    bound_standard_error: float | None
    bound_method: str | None
    adjacency: str
    ratio: float | None              # success rate / bound
    exceeds_bound: bool | None       # CI's lower end above bound + 2 standard errors
    victim_successes: int            # the victim's own tally (all trials it scored)
    victim_trials: int


@dataclass
class InformedGameRun:
    """An informed-adversary run: who, under which threat model, each trial, the summary."""

    fedleak_version: str
    victim: str
    victim_model: str
    dataset: str
    prior_split: str
    defenses: list[str]
    protocol: dict[str, Any]
    threat_model: str
    attack: str = "prior-aware"
    trials: list[TrialRecord] = field(default_factory=list)
    summary: GameSummary | None = None
    files: dict[str, str] = field(default_factory=dict)
    status: str = "running"
    warnings: list[str] = field(default_factory=list)

    def write(self, out: Path) -> None:
        write_json(out / METRICS_NAME, to_json(self))

    def summary_lines(self, out: Path) -> list[str]:
        s = self.summary
        lines = [""]
        if s is None:
            return lines + ["no trial finished"]
        lines.append(f"prior-aware attack: {s.successes}/{s.trials} trials guessed the target "
                     f"= {s.success_rate:.3f} [{s.ci_low:.3f}, {s.ci_high:.3f}] "
                     f"({s.confidence:.0%} Clopper–Pearson); blind guess κ = {s.kappa:.4g}")
        if s.bound is not None:
            se = f" ± {s.bound_standard_error:.4f}" if s.bound_standard_error else ""
            lines.append(f"DP bound (reconstruction robustness, {s.adjacency}, {s.bound_method}):"
                         f" success <= {s.bound:.4f}{se}; measured/bound = {s.ratio:.3f}")
            if s.exceeds_bound:
                lines.append("warning: the measured success exceeds the DP bound beyond its "
                             "interval: the mechanism is not what it claims")
        else:
            lines.append("no DP mechanism published (dpsgd): no bound on success")
        lines.append(f"threat model: {self.threat_model}")
        lines.append(f"metrics: {out / METRICS_NAME}")
        lines += [f"picture: {out / name}" for name in self.files.values()]
        lines += [f"warning: {w}" for w in self.warnings]
        return lines


def noise_free_chain(described: pb.DescribeResponse) -> DefenseChain:
    """The published chain with its noise set to zero and Poisson sampling off (the replay's
    expectation); a defense the server cannot rebuild is refused by name."""
    pairs = []
    for d in described.defenses:
        if d.stage == "transport":
            raise ValueError(f"the game is played by one user; {d.name} aggregates several")
        if d.name == "vet":
            continue
        params = {**{k: v for k, v in d.params.items() if not k.startswith(DECLARED_PREFIX)},
                  **_NOISE_FREE.get(d.name, {})}
        pairs.append((d.name, params))
    try:
        return build_chain(pairs)
    except ValueError as err:
        raise ValueError(f"cannot replay the published defense chain: {err}") from None


def noise_free_replay(described: pb.DescribeResponse, model: torch.nn.Module,
                      parameters: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                      trial: pb.InformedTrial) -> Callable[[torch.Tensor, torch.Tensor],
                                                           list[torch.Tensor]]:
    """``simulate(images, labels)``: the user's update of a batch without the noise.

    Under Poisson sampling the user's batches are secret; the replay takes every record in
    each of the trial's DP steps (FedSGD: the expected update exactly; FedAvg: T full-batch
    steps, its expectation to first order in τ).
    """
    chain = noise_free_chain(described)
    for defense in chain.update:
        defense.bind(list(parameters))
    protocol = protocol_from_pb(trial.protocol)
    poisson = any(d.stage == "per-example" and d.params.get(DECLARED_PREFIX + "sampling") ==
                  "poisson" for d in described.defenses)
    if poisson and protocol.kind == FEDAVG:
        steps = int(trial.metadata.get("dp_steps", trial.local_steps) or 1)
        protocol = dataclasses.replace(protocol, local_epochs=steps, batch_size=0)
    generator = torch.Generator().manual_seed(0)

    def simulate(images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        own = {n: b.clone() for n, b in buffers.items()}
        return defended_update(model, parameters, own, images, labels, protocol, chain,
                               generator)[0]

    return simulate


def mechanism(described: pb.DescribeResponse,
              trial: pb.InformedTrial) -> tuple[float | None, float | None, int | None]:
    """(σ, q, T) of the published DP-SGD as it touched the target
    (:func:`~fedleak.harness.metrics.success_bounds.round_mechanism`); Nones without dpsgd."""
    protocol = protocol_from_pb(trial.protocol)
    found = round_mechanism(dict(trial.metadata),
                            [(d.name, dict(d.params)) for d in described.defenses],
                            1 if protocol.kind != FEDAVG else protocol.local_epochs)
    if found is None:
        return None, None, None
    return found.noise_multiplier, found.sample_rate, found.steps


def play(client: VictimClient, trials: int, out: Path, show_progress: bool = True,
         bound_samples: int = 200_000, seed: int = 0) -> InformedGameRun:
    """Play ``trials`` trials against the victim behind ``client``; write the run to ``out``."""
    described = client.describe()
    if not described.HasField("informed_game"):
        raise VictimError(grpc.StatusCode.FAILED_PRECONDITION,
                          "this victim plays no informed-adversary game: start it with "
                          "--informed-candidates N (and --informed-known M)")
    game = described.informed_game
    info = dataset_info(described)
    model = server_model(described)
    params, buffers = client.global_model()
    out.mkdir(parents=True, exist_ok=True)
    run = InformedGameRun(__version__, client.address, str(described.model.name),
                          described.data.dataset, game.prior_split, defense_specs(described),
                          victim_protocol(described).options(), game.threat_model)
    attack = PriorAwareAttack()
    bar = tqdm(total=trials, desc="informed adversary", unit="trial", disable=not show_progress,
               dynamic_ncols=True)
    verdict = pb.InformedOutcome()
    try:
        for _ in range(trials):
            started = time.perf_counter()
            trial = client.begin_informed_trial(params, buffers)
            candidates = decode_tensor(trial.candidates, "candidates")
            known = decode_tensor(trial.known_images, "known_images")
            observation = InformedObservation(
                update=[decode_tensor(t, "update") for t in trial.update],
                candidates=normalize(candidates, info).float(),
                candidate_labels=torch.tensor(list(trial.candidate_labels), dtype=torch.long),
                known_images=normalize(known, info).float(),
                known_labels=torch.tensor(list(trial.known_labels), dtype=torch.long),
                simulate=noise_free_replay(described, model, params, buffers, trial))
            guess = attack.guess(observation)
            verdict = client.score_informed_guess(trial.trial_id, guess.candidate)
            sigma, q, steps = mechanism(described, trial)
            run.trials.append(TrialRecord(trial.trial_id, guess.candidate, verdict.success,
                                          guess.margin, len(trial.candidate_labels),
                                          len(trial.known_labels), sigma, q, steps,
                                          time.perf_counter() - started))
            bar.update(1)
            bar.set_postfix(success=f"{sum(t.success for t in run.trials)}/{len(run.trials)}")
        run.status = "finished"
    except KeyboardInterrupt:
        run.status = "interrupted"
        raise
    finally:
        bar.close()
        run.summary = summarise(run.trials, game.candidates, game.adjacency or "add-remove",
                                verdict, bound_samples, seed, run.warnings)
        if run.summary is not None:
            s = run.summary
            run.files["picture"] = plot_game(
                out / PICTURE_NAME, _title(run), rate=s.success_rate, low=s.ci_low,
                high=s.ci_high, trials=s.trials, kappa=s.kappa, bound=s.bound,
                bound_error=s.bound_standard_error or 0.0).name
        run.write(out)
    return run


def game_bound(kappa: float, sigma: float | None, q: float | None, steps: int | None,
               adjacency: str, samples: int, seed: int) -> ReconstructionBound | None:
    """The reconstruction-robustness bound of the trial's mechanism (None without DP-SGD)."""
    if sigma is None or q is None or steps is None:
        return None
    return reconstruction_bound(kappa, sigma, q, steps, adjacency=adjacency, samples=samples,
                                seed=seed)


def summarise(trials: list[TrialRecord], candidates: int, adjacency: str,
              verdict: pb.InformedOutcome, samples: int, seed: int,
              warnings: list[str]) -> GameSummary | None:
    """Success rate and interval, and the bound of the trials' mechanism at κ = 1/N."""
    if not trials:
        return None
    mechanisms = {(t.noise_multiplier, t.sample_rate, t.dp_steps) for t in trials}
    if len(mechanisms) > 1:
        warnings.append(f"the trials ran {len(mechanisms)} different mechanisms; the bound is "
                        "the first trial's")
    kappa = 1 / candidates
    bound = game_bound(kappa, trials[0].noise_multiplier, trials[0].sample_rate,
                       trials[0].dp_steps, adjacency, samples, seed)
    rate: SuccessRate = success_rate(sum(t.success for t in trials), len(trials))
    value = bound.value if bound else None
    se = bound.standard_error if bound else None
    return GameSummary(
        trials=rate.trials, successes=rate.successes, success_rate=rate.rate, ci_low=rate.low,
        ci_high=rate.high, confidence=rate.confidence, kappa=kappa, bound=value,
        bound_standard_error=se, bound_method=bound.method if bound else None,
        adjacency=adjacency, ratio=rate.rate / value if value else None,
        exceeds_bound=None if value is None else rate.low > value + 2 * (se or 0.0),
        victim_successes=int(verdict.successes), victim_trials=int(verdict.trials_scored))


def _title(run: InformedGameRun) -> str:
    chain = " + ".join(_short(d) for d in run.defenses) or "no defense"
    return f"informed adversary: {run.victim_model} on {run.dataset} · {chain}"


def _short(spec: str) -> str:
    """``dpsgd:...,noise-multiplier=1.0,...`` → ``dpsgd σ=1.0`` (the name and its strength)."""
    name, _, rest = spec.partition(":")
    params = dict(item.split("=", 1) for item in rest.split(",") if "=" in item)
    strength = params.get("noise-multiplier") or params.get("sigma") or params.get("p")
    return name + (f" σ={strength}" if strength and name in ("dpsgd", "noise") else
                   f" {strength}" if strength else "")
