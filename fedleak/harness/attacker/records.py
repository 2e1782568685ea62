"""Typed records of an attack run: what ``metrics.json`` holds, and the summary a person reads.

An update-threat-model run (:class:`UpdateRun`) is one :class:`RoundRecord` per attacked round
with the victim's per-image scores; a release run (:class:`~fedleak.harness.attacker.
release_records.ReleaseRun`, in its own module) is one release, the KKT candidates and the
victim's per-training-sample scores. Both share a :class:`RunHeader` (who
attacked whom with what, where) and know how to write themselves (``metrics.json``, rewritten
atomically) and how to summarise themselves for the terminal (:meth:`summary_lines`).
Optional fields marked ``omit_if_none`` are left out of the JSON when unset, so a reader tells
"not measured" from "measured as null".
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedleak import __version__
from fedleak.harness.attacker.run_summary import RunSummary
from fedleak.harness.metrics.floors import FLOOR_MARGIN_DB, FloorSummary, floor_words
from fedleak.harness.metrics.image_metrics import EXACT_PSNR
from fedleak.harness.metrics.success_bounds import SuccessPlacement

OMIT = {"omit_if_none": True}
METRICS_NAME = "metrics.json"
__all__ = ["EXACT_PSNR"]


def to_json(record: Any) -> Any:
    """A record (dataclass, list, dict, value) as plain JSON values, in field order."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        out = {}
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            if value is None and f.metadata.get("omit_if_none"):
                continue
            out[f.name] = to_json(value)
        return out
    if isinstance(record, dict):
        return {str(k): to_json(v) for k, v in record.items()}
    if isinstance(record, list | tuple):
        return [to_json(v) for v in record]
    return record


def write_json(path: Path, value: Any) -> None:
    """Write ``value`` as indented JSON atomically (a reader never sees half a file)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(to_json(value), indent=2))
    os.replace(partial, path)


@dataclass
class RunHeader:
    """Who attacked whom, with what, where."""

    fedleak_version: str
    victim: str
    victim_model: str
    dataset: str
    attack: str
    attack_config: dict[str, Any]
    settings: dict[str, Any]
    device: str
    torch: str
    machine: str
    #: the attacker process's intra-op threads at the start (``torch.get_num_threads()``); a
    #: first-order loop on one small image runs on one whatever this says
    #: (:mod:`fedleak.attacks.optimisation.engine.intra_op_threads`)
    threads: int
    #: the threat model's server: honest, malicious-parameters or malicious-architecture
    #: (``threat_model`` in a release run's JSON says what the server holds instead)
    server_role: str = "honest"

    @classmethod
    def now(cls, victim: str, victim_model: str, dataset: str, attack: str,
            attack_config: dict[str, Any], settings: dict[str, Any], device: str,
            server_role: str = "honest") -> RunHeader:
        return cls(__version__, victim, victim_model, dataset, attack, attack_config, settings,
                   device, torch.__version__, platform.machine(), torch.get_num_threads(),
                   server_role)


# --------------------------------------------------------------------------- update rounds


@dataclass
class ImageRecord:
    """The victim's score of one reconstructed image (matched one-to-one to the truth);
    ``padding``: its match is one of the attack's placeholders; ``exact``: the image is in the
    victim's exact matching (PSNR >= EXACT_PSNR against a non-padding reconstruction)."""

    index: int
    matched_index: int
    psnr: float
    ssim: float
    mse: float
    padding: bool = False
    exact: bool = False
    #: the victim's Fisher-information PSNR ceiling for this private image (Guo et al. 2022)
    fisher_psnr_ceiling: float | None = field(default=None, metadata=OMIT)
    #: this image's trivial floor (the best constant guess, scored by the victim), its SSIM
    #: and which guess it is (:mod:`~fedleak.harness.metrics.floors`)
    floor_psnr: float | None = field(default=None, metadata=OMIT)
    floor_ssim: float | None = field(default=None, metadata=OMIT)
    floor_guess: str | None = field(default=None, metadata=OMIT)


@dataclass
class FeatureRecord:
    """The victim's score of one recovered layer input."""

    index: int
    matched_index: int
    cosine: float
    relative_error: float


@dataclass
class RoundRecord:
    """One attacked round: what came back, what the attack found, how the victim scored it."""

    round_id: str
    update_kind: str
    num_images: int
    local_steps: int
    victim_metadata: dict[str, str]
    iterations: int
    objective: float
    restart_objectives: list[float]
    wall_time_s: float
    labels: list[int]
    mean_psnr: float | None
    mean_ssim: float | None
    mean_mse: float | None
    label_accuracy: float | None
    images: list[ImageRecord] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    feature_layer: str | None = field(default=None, metadata=OMIT)
    features_file: str | None = field(default=None, metadata=OMIT)
    mean_feature_cosine: float | None = field(default=None, metadata=OMIT)
    mean_feature_relative_error: float | None = field(default=None, metadata=OMIT)
    features: list[FeatureRecord] | None = field(default=None, metadata=OMIT)
    reveal_error: str | None = field(default=None, metadata=OMIT)
    #: the victim's privacy accounting after this round, as numbers (ε, δ of a DP defense)
    privacy: dict[str, float] | None = field(default=None, metadata=OMIT)
    #: why the round has no scores (the victim went away before scoring it)
    unscored: str | None = field(default=None, metadata=OMIT)
    #: how many targets (rounds, or sweep points' victims) were attacked as one computation
    packed_with: int | None = field(default=None, metadata=OMIT)
    #: exact recoveries as the victim counts them: the largest one-to-one matching at PSNR >=
    #: EXACT_PSNR, padding left out (None: not scored)
    exact: int | None = field(default=None, metadata=OMIT)
    #: the best PSNR of any private image against any non-padding reconstruction
    best_psnr: float | None = field(default=None, metadata=OMIT)
    #: successes as the victim counts them: the largest one-to-one matching at SUCCESS_PSNR
    #: and the floor margin above each image's floor
    successes: int | None = field(default=None, metadata=OMIT)
    #: the round's trivial floors (each constant guess, the per-image floors' mean, the
    #: margin above them, the images above their floor), scored by the victim
    floors: FloorSummary | None = field(default=None, metadata=OMIT)
    #: the reconstruction's placeholder slots (the attack's padding)
    padding: list[int] | None = field(default=None, metadata=OMIT)
    #: probe rounds a malicious server ran (at other crafted θ) before this one
    probe_rounds: int | None = field(default=None, metadata=OMIT)
    #: what the attack reports of itself (bins, expected exact recoveries, ...)
    attack_extras: dict[str, Any] | None = field(default=None, metadata=OMIT)
    #: the attack parts it ran with (objective, replay) and why (chosen from the published
    #: defenses when ``auto``), for optimisation attacks built from parts
    parts: dict[str, object] | None = field(default=None, metadata=OMIT)
    #: what the server held when it is not one user's update (a Flower SecAgg+ round: the
    #: aggregate of K nodes), and that aggregate's survivors, weights and scoring
    server_view: str | None = field(default=None, metadata=OMIT)
    aggregate: dict[str, Any] | None = field(default=None, metadata=OMIT)
    #: exact: the replay is the user's update (as stated); inexact: fedleak knows it is not,
    #: for the reasons in ``inexact_reasons`` (:mod:`~fedleak.harness.federated.replay_fidelity`),
    #: and the round's figures are a lower bound, summarised apart
    replay: str = "exact"
    inexact_reasons: list[str] | None = field(default=None, metadata=OMIT)
    #: modelled: the user's order is unknown and the attack made it a variable of its replay
    #: (the notes say how); the round is a measurement, in the headline with the exact ones
    replay_model: list[str] | None = field(default=None, metadata=OMIT)
    #: the defense chain the update carried, as the user published it (``name:k=v,...``)
    defenses: list[str] | None = field(default=None, metadata=OMIT)
    #: a stable readable name of who sent the update (a Flower node), beside ``round_id``
    node: str | None = field(default=None, metadata=OMIT)
    #: the partition-id the node states (its node config), when it says it: stable across runs
    partition: int | None = field(default=None, metadata=OMIT)
    #: a Flower audit's budget for this update, in work: the iterations asked and run, and how
    #: many updates were queued ahead of it in the audit's worker
    budget: dict[str, float] | None = field(default=None, metadata=OMIT)
    #: why the victim gave no Fisher ceiling for this round's images (when it gave none)
    fisher_note: str | None = field(default=None, metadata=OMIT)
    #: why a safety time limit cut the attack before it spent its work budget: the round is
    #: truncated, not a measurement (:mod:`~fedleak.attacks.safety_limit`)
    truncated: str | None = field(default=None, metadata=OMIT)


@dataclass
class UpdateRun:
    """A run against updates (FedSGD gradients, FedAvg deltas, secure-aggregation sums)."""

    header: RunHeader
    rounds: list[RoundRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # about the whole run
    #: running, finished, interrupted (Ctrl-C), victim gone (it died mid-run) or failed (an
    #: error ended the run; the warnings say which)
    status: str = "running"
    #: why the run ended as it did when it is not ``finished`` (a Flower audit: what ended the
    #: ServerApp, what is missing from the report), and the phase a running audit is in
    status_reason: str | None = None
    phase: str | None = None
    #: a malicious server's probe of the same deployment (a Flower audit's ``probe``): its own
    #: threat model, never in ``summary`` (:mod:`~fedleak.harness.flower.probe`)
    malicious_probe: Any = None
    #: success at a PSNR threshold, κ of the public prior and the DP bound beside it
    #: (:mod:`fedleak.harness.metrics.success_bounds`), once the run ended
    placement: SuccessPlacement | None = None

    @property
    def measured(self) -> list[RoundRecord]:
        """The rounds that are measurements: neither truncated by a safety limit nor known
        to be an inexact replay."""
        return [r for r in self.rounds if r.replay != "inexact" and r.truncated is None]

    @property
    def summary(self) -> RunSummary:
        """Means over the measured rounds: exact and modelled ones (inexact ones:
        :attr:`lower_bound`; truncated ones: :attr:`truncated`, never summarised)."""
        return RunSummary.of(self.measured)

    @property
    def lower_bound(self) -> RunSummary | None:
        """Means over the rounds whose replay fedleak knows to be inexact (None: none)."""
        inexact = [r for r in self.rounds if r.replay == "inexact" and r.truncated is None]
        return RunSummary.of(inexact) if inexact else None

    @property
    def truncated(self) -> list[str]:
        """One line per round a safety time limit cut short (not measurements)."""
        return [f"round {i} ({r.round_id}): {r.truncated}" for i, r in enumerate(self.rounds)
                if r.truncated is not None]

    def to_json(self) -> dict[str, Any]:
        out = {**to_json(self.header), "status": self.status,
               **({"status_reason": self.status_reason} if self.status_reason else {}),
               **({"phase": self.phase} if self.phase else {}),
               "rounds": to_json(self.rounds),
               "summary": to_json(self.summary), "truncated": self.truncated}
        bound = self.lower_bound
        if bound is not None:
            out["inexact_summary"] = {**to_json(bound), "meaning": (
                "rounds whose replay fedleak knows differs from the user's update: a lower "
                "bound on what leaked, not a measurement (see each round's inexact_reasons)")}
        out["warnings"] = list(self.warnings)
        if self.placement is not None:
            out["success"] = to_json(self.placement)
        if self.malicious_probe is not None:
            out["malicious_probe"] = to_json(self.malicious_probe)
        return out

    def write(self, out: Path) -> None:
        write_json(out / METRICS_NAME, self.to_json())

    def summary_lines(self, out: Path) -> list[str]:
        """The table of scored images, the means, and where the files are."""
        lines = [""]
        if any(r.images for r in self.rounds):
            lines.append(f"{'round':>5}  {'image':>13}  {'PSNR dB':>8}  {'SSIM':>6}  "
                         f"{'MSE':>8}  {'time s':>7}")
        for i, r in enumerate(self.rounds):
            mark = "  (TRUNCATED: not a measurement)" if r.truncated is not None else {
                "inexact": "  (inexact replay: lower bound)",
                "modelled": "  (order unknown, modelled)"}.get(r.replay, "")
            for img in r.images:
                which = f"{img.index + 1} of {r.num_images}"
                note = "  (padding)" if img.padding else ""
                lines.append(f"{i:>5}  {which:>13}  {img.psnr:>8.2f}  {img.ssim:>6.3f}  "
                             f"{img.mse:>8.5f}  {r.wall_time_s:>7.1f}{mark}{note}")
            if r.unscored:
                lines.append(f"{i:>5}  unscored: {r.unscored}")
        for line in self.truncated:
            lines.append(f"TRUNCATED (not a measurement, left out of every figure): {line}")
        bound = self.lower_bound
        if bound is not None:
            lines.append(lower_bound_line(bound))
            for reason in sorted({x for r in self.rounds for x in r.inexact_reasons or []}):
                lines.append(f"inexact: {reason}")
        s = self.summary
        acc = "n/a" if s.label_accuracy is None else f"{s.label_accuracy:.0%}"
        if s.mean_psnr is not None and s.mean_ssim is not None:
            lines.append(f"mean PSNR {s.mean_psnr:.2f} dB, mean SSIM {s.mean_ssim:.3f}, "
                         f"label accuracy {acc} over {s.images} image(s) (higher PSNR and SSIM: "
                         "more of the private images leaked)")
        if s.floors is not None:
            lines.append(floor_words(s.floors, s.label_accuracy))
        placed = self.placement
        if placed is not None and placed.images:
            line = (f"success at {placed.success_psnr:g} dB and {FLOOR_MARGIN_DB:g} dB above "
                    f"the floor: {placed.successes} of {placed.images} image(s)")
            if placed.kappa is not None:
                line += f"; blind-guess baseline κ = {placed.kappa:.3g} (public prior)"
            if placed.bound is not None:
                line += f"; DP bound on any attack's success {placed.bound:.3g}"
            lines.append(line)
        if s.mean_fisher_psnr_ceiling is not None:
            lines.append(f"Fisher ceiling (unbiased reconstructions, Guo et al. 2022): mean "
                         f"{s.mean_fisher_psnr_ceiling:.2f} dB")
        if s.exact is not None:
            lines.append(f"exact recoveries (PSNR >= {EXACT_PSNR:g} dB, largest one-to-one "
                         f"matching): {s.exact} of {s.images} image(s) (threat model: "
                         f"{self.header.server_role} server)")
        if s.best_psnr is not None:
            lines.append(f"best image: {s.best_psnr:.2f} dB (padding slots never count)")
        if s.epsilon is not None:
            delta = f" at δ = {s.delta:g}" if s.delta is not None else ""
            lines.append(f"privacy spent (the victim's DP accountant): ε = {s.epsilon:.4g}{delta}")
        if s.mean_feature_cosine is not None:
            lines.append(f"recovered features: mean cosine {s.mean_feature_cosine:.6f}, mean "
                         f"relative error {s.mean_feature_relative_error:.2e}, label accuracy "
                         f"{acc}")
        if self.malicious_probe is not None:
            lines += self.malicious_probe.summary_lines()
        lines.append(f"metrics: {out / METRICS_NAME}")
        for r in self.rounds:
            picture = r.files.get("comparison") or r.files.get("reconstruction")
            if picture:
                lines.append(f"picture: {out / picture}")
            if r.features_file:
                lines.append(f"features: {out / r.features_file}")
        for warning in [*self.warnings,
                        *sorted({w for r in self.rounds for w in r.warnings})]:
            lines.append(f"warning: {warning}")
        return lines


def lower_bound_line(bound: RunSummary) -> str:
    """The one line a summary gives its inexact rounds: labelled a lower bound."""
    if bound.mean_psnr is None or bound.mean_ssim is None:
        return f"inexact replay, {bound.rounds} round(s) unscored (not a measurement)"
    line = (f"LOWER BOUND ONLY (inexact replay, {bound.rounds} round(s), not a measurement): "
            f"mean PSNR {bound.mean_psnr:.2f} dB, mean SSIM {bound.mean_ssim:.3f} over "
            f"{bound.images} image(s)")
    return line + (f"; {floor_words(bound.floors, bound.label_accuracy)}"
                   if bound.floors is not None else "")
