"""A sweep point on a text victim: what its attack run and its federated training measure.

- Leakage (:func:`text_attack_measurement`): the text run's means over K attacked rounds —
  ROUGE-1/2/L of the private sentences matched one-to-one, sentences recovered exactly, the
  token set's precision and recall — as the victim scored them.
- Utility (:func:`text_federated_training`): the victim's global model trained R rounds through
  the defended path (the same server update as for images: FedSGD θ ← θ − η_r g̃, FedAvg
  θ ← θ + Δ̃), evaluated on the first :data:`EVALUATED` sentences of the corpus's held-out
  split: a language model's perplexity and next-token accuracy, a classifier's accuracy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from fedleak.harness.attacker.client import ReceivedUpdate, VictimClient
from fedleak.harness.attacker.described import defense_specs
from fedleak.harness.attacker.text.text_described import text_info, text_server_model
from fedleak.harness.attacker.text.text_records import TextRun
from fedleak.harness.federated.text_training import TextUtility, text_utility
from fedleak.harness.sweep.grid.points import Point, UtilitySettings
from fedleak.harness.sweep.measure.measurements import (
    AttackMeasurement,
    RoundMeasurement,
    UtilityMeasurement,
    float_or_none,
)
from fedleak.harness.zoo.text.text_datasets import TextDataset, load_text_dataset
from fedleak.v1 import victim_pb2 as pb

#: held-out sentences a utility evaluation reads (the first ones of the test split)
EVALUATED = 256


def text_attack_measurement(point: Point, record: TextRun, described: pb.DescribeResponse,
                            out: Path, run_dir: Path, seconds: float) -> AttackMeasurement:
    """What the store keeps of one text point's attack run (paths relative to ``run_dir``)."""
    rounds = [RoundMeasurement(
        epsilon_total=float_or_none(entry.victim_metadata.get("epsilon_total")),
        files={k: str((out / v).relative_to(run_dir)) for k, v in entry.files.items()},
    ) for entry in record.rounds]
    last = record.rounds[-1].victim_metadata if record.rounds else {}
    s = record.summary()
    return AttackMeasurement(
        attack=point.attack, model=record.header.victim_model, dataset=record.header.dataset,
        run=str(out.relative_to(run_dir)), images=s["sentences"], wall_time_s=s["wall_time_s"],
        rounds=rounds, epsilon=float_or_none(last.get("epsilon_total")),
        delta=float_or_none(last.get("delta")), defenses=defense_specs(described),
        measure_time_s=seconds, server_role=record.header.server_role,
        rouge1=s["rouge1"], rouge2=s["rouge2"], rougeL=s["rougeL"],
        exact_sentences=s["exact"], token_precision=s["token_precision"],
        token_recall=s["token_recall"])


def text_federated_training(client: VictimClient, settings: UtilitySettings,
                            described: pb.DescribeResponse, learning_rate: Callable[[int], float],
                            update: Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor]],
                                             ReceivedUpdate],
                            on_round: Callable[[int, str], None] | None = None,
                            data_root: str | None = None) -> UtilityMeasurement:
    """Train the text victim's global model for ``settings.rounds`` rounds; ``update(θ,
    buffers)`` is one round's received update (ComputeUpdate or a secure-aggregation mean)."""
    started = time.perf_counter()
    info = text_info(described)
    model = text_server_model(described, info)
    params, buffers = client.global_model()
    t = described.data.text
    test = load_text_dataset(described.data.dataset, "test", task=t.task, seq_len=t.seq_len,
                             data_root=data_root, tokenizer=info.checked_tokenizer)
    test = test.select(torch.arange(min(EVALUATED, len(test))))
    first = _evaluate(model, params, buffers, test)
    curve, last = [(0, first.accuracy)], first
    checkpoints = {round(settings.rounds * (i + 1) / settings.evaluations)
                   for i in range(settings.evaluations)}
    metadata: dict[str, str] = {}
    for r in range(settings.rounds):
        received = update(params, buffers)
        metadata, values = received.metadata, received.update
        if received.update_kind == "delta":
            params = {k: p + u for (k, p), u in zip(params.items(), values, strict=True)}
        else:
            eta = learning_rate(r)
            params = {k: p - eta * u for (k, p), u in zip(params.items(), values, strict=True)}
        text = f"round {r + 1}/{settings.rounds}"
        if r + 1 in checkpoints:
            last = _evaluate(model, params, buffers, test)
            curve.append((r + 1, last.accuracy))
            text += f", test accuracy {last.accuracy:.1%}" + (
                f", perplexity {last.perplexity:.4g}" if last.perplexity is not None else "")
        if on_round is not None:
            on_round(r, text)
    return UtilityMeasurement(
        test_accuracy=last.accuracy, initial_accuracy=first.accuracy, curve=curve,
        rounds=settings.rounds, batch_size=settings.batch_size, lr=settings.lr,
        schedule=settings.schedule, protocol=described.protocol.kind,
        epsilon=float_or_none(metadata.get("epsilon_total")),
        delta=float_or_none(metadata.get("delta")), defenses=defense_specs(described),
        test_images=len(test), training_time_s=time.perf_counter() - started,
        perplexity=last.perplexity, initial_perplexity=first.perplexity)


def _evaluate(model: torch.nn.Module, params: dict[str, torch.Tensor],
              buffers: dict[str, torch.Tensor], test: TextDataset) -> TextUtility:
    state = {**params, **buffers}
    kept = model.state_dict().keys()  # not the non-persistent buffers (rotary frequencies)
    model.load_state_dict({k: v for k, v in state.items() if k in kept}, strict=True)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name not in kept and name in state:
                buffer.copy_(state[name])
    return text_utility(model, test)
