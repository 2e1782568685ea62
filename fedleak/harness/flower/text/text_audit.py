"""``TextLeakageAudit``: the Flower strategy wrapper of :mod:`~fedleak.harness.flower.
leakage_audit` for a text federation, and the simulation that runs one.

Every node's reply is read as for images (the θ the round sent, the update θ′ − θ or the
one-step FedSGD gradient, the defenses the reply publishes, the procedure of the train
config), then attacked as a server attacks a text victim: a
:class:`~fedleak.attacks.text_observation.TextObservation` with the harness's replay
(:func:`~fedleak.harness.federated.text_observe.text_observation_from_update`), any text attack
(``token-set``, ``dager``, ``lamp``, ``tag``), the node scoring the recovered token ids against
the batch it trained on (:func:`~fedleak.harness.flower.text.text_client.text_score`), and the run
folder ``fedleak attack`` writes for a text victim (``metrics.json``, per reply
``reconstruction.json`` and ``comparison.md``). The replies then go to the inner strategy
unchanged. ``fedleak flower simulate --dataset shakespeare --model gpt2:...`` runs it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Unpack

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Strategy

from fedleak.attacks.text.text_attack import TextAttack
from fedleak.attacks.text_observation import TextReconstruction
from fedleak.harness.attacker.attack_progress import reconstruct_with_progress
from fedleak.harness.attacker.client import ReceivedUpdate
from fedleak.harness.attacker.records import METRICS_NAME, RoundRecord
from fedleak.harness.attacker.text.text_records import TextRun, comparison_markdown, floor_note
from fedleak.harness.attacker.text.text_rounds import padded, round_entry
from fedleak.harness.federated.text_observe import text_observation_from_update
from fedleak.harness.flower.arrays import tensors
from fedleak.harness.flower.auditor import AuditOptions, ScoreAnswer, Scorer, score_error
from fedleak.harness.flower.federation import FederationSettings
from fedleak.harness.flower.leakage_audit import LeakageAudit
from fedleak.harness.flower.node.node_scoring import REVEALED, SCORE_MESSAGE_TYPE, SCORE_METRICS
from fedleak.harness.flower.text.text_client import (
    make_text_client_app,
    text_submission,
    text_train_data,
)
from fedleak.harness.zoo.text.text_datasets import TextInfo
from fedleak.harness.zoo.text.text_models import TextModel, build_text_model
from fedleak.v1 import victim_pb2 as pb


class TextLeakageAudit(LeakageAudit):
    """Attack every node's reply of a text federation with a text attack (module docstring),
    in the round (``background`` does not apply: the audit worker attacks images)."""

    in_background = False

    def __init__(self, inner: Strategy, model: TextModel, info: Any, out: Path,
                 **audit: Unpack[AuditOptions]) -> None:
        if audit.get("record_only"):
            raise ValueError("record-only audits write image rounds; attack a text "
                             "federation's replies as they come")
        # a text attack's work is its own budget; it runs in the round and the node scores
        # it there (the worker process of image audits attacks images only)
        audit = {**audit, "background": False}
        super().__init__(inner, model, info, out, **audit)
        if not isinstance(self.attack, TextAttack):
            raise ValueError(f"attack {self.attack_name!r} reconstructs images; a text "
                             "federation takes token-set, dager, lamp or tag")
        self.run = TextRun(self.run.header, warnings=list(self.run.warnings))  # type: ignore[assignment]
        self.run.write(self.out)

    def _audit_update(self, server_round: int, label: str, folder: str,
                      received: ReceivedUpdate, params: dict[str, torch.Tensor],
                      buffers: dict[str, torch.Tensor], warnings: list[str],
                      scorer: Scorer | None, inexact: Sequence[str] = (), *,
                      node: int | None = None, clipping_norm: float | None = None
                      ) -> RoundRecord | None:
        assert isinstance(self.model, TextModel) and isinstance(self.info, TextInfo)
        observation = text_observation_from_update(
            self.model, params, buffers, received.update, received.protocol, self.info,
            num_sequences=received.num_images, update_kind=received.update_kind,
            local_steps=received.local_steps, metadata=received.metadata, device=self.device,
            defenses=received.defenses or ())
        started = time.perf_counter()
        found = reconstruct_with_progress(self.attack, observation, device=self.device,
                                          seed=self.seed + server_round - 1,
                                          label=f"round {server_round} {label}",
                                          show=self.show_progress)
        wall = time.perf_counter() - started
        assert isinstance(found, TextReconstruction)
        entry = round_entry(received, found, wall, self.attack.budget())
        entry.warnings += [*warnings, *inexact]
        entry.defenses = None if received.defenses is None else \
            [d.spec() for d in received.defenses]
        tok = self.info.checked_tokenizer
        recovered = [tok.decode(s) for s in found.sequences]
        round_dir = self.out / folder
        round_dir.mkdir(parents=True, exist_ok=True)
        (round_dir / "reconstruction.json").write_text(json.dumps(
            {"sequences": found.sequences, "text": recovered, "token_set": found.token_set},
            indent=2))
        entry.files["reconstruction"] = f"{folder}/reconstruction.json"
        self._token_set = found.token_set
        score, truth, unscored = scorer(padded(found.sequences), [], list(found.padding)) \
            if self.score and scorer is not None else (None, None, "scoring on the nodes is off")
        private = None
        if score is not None:
            entry.score(score)
            if truth is not None:
                private = [tok.decode([t for t in row if t >= 0]) for row in truth.tolist()]
        entry.unscored = unscored
        (round_dir / "comparison.md").write_text(comparison_markdown(
            f"round {server_round}, {label}: {self.attack_name}", recovered, entry, private))
        entry.files["comparison"] = f"{folder}/comparison.md"
        self.run.rounds.append(entry)  # type: ignore[arg-type]
        self.run.write(self.out)
        self.log(f"{label}, round {server_round}: " + (
            f"ROUGE-1 {entry.rouge1:.4f}, ROUGE-2 {entry.rouge2:.4f}{floor_note(entry)}"
            if entry.rouge1 is not None
            else f"token set P {entry.token_precision} R {entry.token_recall}"
            if entry.token_precision is not None else f"unscored ({unscored})"))
        return None

    def _node_score(self, server_round: int, node: int, images: torch.Tensor | None,
                    labels: list[int], *, aggregate: bool = False,
                    padding: list[int] | None = None) -> ScoreAnswer:
        """Ask ``node`` to score the recovered token ids (``images`` holds them here)."""
        if self._grid is None:
            return None, None, "no grid to reach the node (no train round was configured)"
        query = Message(text_submission(server_round, images, padding or [],
                                        getattr(self, "_token_set", None)),
                        dst_node_id=node, message_type=SCORE_MESSAGE_TYPE,
                        group_id=str(server_round))
        answers = list(self._grid.send_and_receive([query], timeout=self.score_timeout))
        if not answers:
            return None, None, f"the node did not answer in {self.score_timeout:g} s"
        answer = answers[0]
        if answer.has_error():
            return None, None, score_error(answer.error.reason or "")
        metrics: dict[str, Any] = dict(answer.content.metric_records.get(SCORE_METRICS) or {})
        text = pb.TextScore(token_set_scored=True,
                            token_precision=float(metrics.get("token-precision", 0.0)),
                            token_recall=float(metrics.get("token-recall", 0.0)),
                            tokens_recovered=int(metrics.get("tokens-recovered", 0)),
                            tokens_true=int(metrics.get("tokens-true", 0)))
        if "rouge1" in metrics:
            text.sequences_scored = True
            text.rouge1, text.rouge2 = float(metrics["rouge1"]), float(metrics["rouge2"])
            text.rouge_l, text.exact = float(metrics["rouge-l"]), int(metrics["exact"])
            text.sentences = int(metrics["sentences"])
            if "floor-rouge1" in metrics:
                text.floor_scored = True
                text.floor_rouge1 = float(metrics["floor-rouge1"])
                text.floor_rouge2 = float(metrics["floor-rouge2"])
                text.floor_rouge_l = float(metrics["floor-rouge-l"])
            columns = [list(metrics.get(f"sentence-{k}") or []) for k in
                       ("matched", "rouge1", "rouge2", "rouge-l", "exact", "padding")]
            for i, (j, r1, r2, rl, exact, pad) in enumerate(zip(*columns, strict=False)):
                text.sentence_scores.add(index=i, matched_index=int(j), rouge1=float(r1),
                                         rouge2=float(r2), rouge_l=float(rl),
                                         exact=bool(exact), padding=bool(pad))
        revealed = answer.content.array_records.get(REVEALED)
        truth = tensors(revealed)["images"] if revealed is not None else None
        return pb.ScoreResponse(text=text), truth, None


def run_text_server(grid: Grid, s: FederationSettings) -> TextLeakageAudit | None:
    """FedAvg over every node for ``s.rounds`` rounds, each reply attacked (``s.audit``)."""
    data = text_train_data(s.dataset, s.model)
    torch.manual_seed(s.model_seed)
    model = build_text_model(s.model, data.info)
    config = {**s.procedure().config(), **s.extra_config}
    inner = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=s.nodes,
                   min_available_nodes=s.nodes)
    initial = ArrayRecord(model.state_dict())
    if not s.audit:
        inner.start(grid, initial, num_rounds=s.rounds, train_config=ConfigRecord(config))
        return None
    audit = TextLeakageAudit(inner, model, data.info, Path(s.out), attack=s.attack,
                             options=s.attack_options(), seed=s.seed, score=s.score,
                             overwrite=s.overwrite)
    audit.start(grid, initial, num_rounds=s.rounds, train_config=ConfigRecord(config))
    return audit


def simulate_text(settings: FederationSettings, *, verbose: bool = False) -> dict[str, Any]:
    """A text federation in Flower's simulation engine (Ray of its own, one CPU per node);
    returns the audit's ``metrics.json`` (empty when unaudited)."""
    from flwr.simulation import run_simulation

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        run_text_server(grid, settings)

    run_simulation(server, make_text_client_app(settings), num_supernodes=settings.nodes,
                   verbose_logging=verbose,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"address": "local", "num_cpus": settings.nodes,
                                                 "include_dashboard": False}})
    metrics = Path(settings.out) / METRICS_NAME
    return json.loads(metrics.read_text()) if settings.audit and metrics.exists() else {}
