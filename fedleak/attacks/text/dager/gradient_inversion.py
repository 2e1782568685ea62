"""DAGER (Petrov et al., NeurIPS 2024) as the registered attack ``dager``.

``dager``: DAGER (Petrov et al., NeurIPS 2024, arXiv 2405.15586) as a registered attack on a
:class:`~fedleak.attacks.text_observation.TextObservation`.

The algorithm is :func:`fedleak.attacks.text.dager.layer_search.dager` (the span checks, the
decoder's greedy search, the encoder's search; its docstring states the maths and where it stops:
B·T ≥ d). This class only reads the observation — the ``transformers`` model with θ, the
update by parameter name oriented like a gradient, the batch size n, the sequence length T and
the end token of the published layout — and turns the result into a
:class:`~fedleak.attacks.text_observation.TextReconstruction`: every recovered sentence,
its certificate, the work spent (sentence evaluations, the attack's budget) and whether a cap
cut the search (``truncated``).

A FedAvg delta of one local step is −τ g: the same spans, so DAGER applies; over several steps
no span holds the inputs exactly, and the attack says so (it still runs: what it recovers
there is a lower bound). LoRA updates carry adapters, not the first layers' gradients: refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from fedleak.attacks.attack_registry import register_attack
from fedleak.attacks.base import Progress, UpdateSetting
from fedleak.attacks.observation import Reconstruction
from fedleak.attacks.text.dager.layer_search import DagerConfig, dager
from fedleak.attacks.text.dager.peeling import SentenceGradient
from fedleak.attacks.text.text_attack import TextAttack
from fedleak.attacks.text_observation import ENCODER, TextObservation, TextReconstruction

_DEFAULTS = DagerConfig()


@dataclass
class DagerAttackConfig:
    """Options of the ``dager`` attack: the span thresholds τ₁, τ₂ and the search's limits."""

    l1_threshold: float = field(default=_DEFAULTS.l1_threshold, metadata={
        "help": "τ₁: the token filter's largest span distance (first layer)"})
    l2_threshold: float = field(default=_DEFAULTS.l2_threshold, metadata={
        "help": "τ₂: the sentence check's largest span distance (second layer)"})
    max_candidates: int = field(default=_DEFAULTS.max_candidates, metadata={
        "help": "tokens kept per position by the filter (a cap that bites: truncated)"})
    max_prefixes: int = field(default=_DEFAULTS.max_prefixes, metadata={
        "help": "the decoder's live prefixes (a cap that bites: truncated)"})
    max_evaluations: int = field(default=_DEFAULTS.max_evaluations, metadata={
        "help": "budget: (partial) sentences whose second-layer input is computed"})
    restarts: int = field(default=_DEFAULTS.restarts, metadata={
        "help": "encoder: failed starts in a row before the search stops"})
    screen: int = field(default=_DEFAULTS.screen, metadata={
        "help": "encoder: moves its first-order screen passes to exact evaluation per step"})


@register_attack("dager")
class Dager(TextAttack):
    """Exact sentences from the low rank of a transformer's attention gradients."""

    Config = DagerAttackConfig
    architectures: ClassVar[tuple[str, ...]] = ("decoder", "encoder")

    @classmethod
    def unsuited(cls, setting: UpdateSetting) -> str | None:
        """Refuse more than one local step: DAGER needs one FedSGD gradient."""
        if setting.local_steps > 1:
            return (f"DAGER reads one gradient; {setting.local_steps} local steps put the "
                    "inputs in no span exactly")
        return None

    def budget(self) -> int | None:
        """Return the most sentence evaluations the encoder search may spend."""
        return int(self.config.max_evaluations)

    def recover(self, target: TextObservation, *, device: torch.device, seed: int,
                progress: Progress | None) -> Reconstruction:
        """Recover the batch's sentences with DAGER (module docstring)."""
        c: DagerAttackConfig = self.config
        if target.lora:
            raise ValueError("DAGER needs the gradients of the first two layers' projections; "
                             "a LoRA update carries adapters only (attack the full model's "
                             "updates, or use lamp)")
        warnings = []
        if target.local_steps > 1:
            warnings.append(f"the update is {target.local_steps} local steps (FedAvg): DAGER's "
                            "spans hold the inputs exactly only for one gradient, so what it "
                            "recovers here is a lower bound")
        config = DagerConfig(
            l1_threshold=c.l1_threshold, l2_threshold=c.l2_threshold,
            max_length=target.seq_len, max_candidates=c.max_candidates,
            max_prefixes=c.max_prefixes, max_evaluations=c.max_evaluations,
            restarts=c.restarts, screen=c.screen, seed=seed,
            end_token=target.end_id if target.architecture == ENCODER else None,
            start_token=target.start_id)
        gradients = {n: g.to(device) for n, g in target.named_gradients().items()}
        result = dager(target.model, gradients, target.num_sequences, config, progress,
                       sentence_gradient=_sentence_gradient(target, device),
                       classes=target.num_classes if target.architecture == ENCODER else 0)
        if progress is not None:
            progress(result.evaluations, c.max_evaluations, float(len(result.sentences)))
        extras = {"certified": sum(result.certified), "sentences": len(result.sentences),
                  "ranks": list(result.ranks), "hidden_size": result.hidden_size,
                  "candidates_per_position": result.candidates[:8],
                  "evaluations": result.evaluations, "truncated": result.truncated,
                  "pinned": result.pinned}
        padding = []
        sequences = [list(s) for s in result.sentences]
        while len(sequences) < target.num_sequences:  # placeholders where nothing came back
            padding.append(len(sequences))
            sequences.append([])
        return TextReconstruction(
            sequences=sequences, padding=padding, iterations=result.evaluations,
            objective=max(result.scores, default=0.0), warnings=warnings + result.warnings,
            extras=extras)


def _sentence_gradient(target: TextObservation, device: torch.device) -> SentenceGradient:
    """One sentence's own gradient with a label, by the user's replay (a batch of one).

    Padded to the round's length as the user's batch is (padding is masked); oriented like
    :meth:`~fedleak.attacks.text_observation.TextObservation.named_gradients`.
    """
    table = target.model.get_input_embeddings()  # type: ignore[operator]
    embeddings = table.weight.detach()
    names = target.parameter_names

    def gradient(tokens: list[int], label: int) -> dict[str, torch.Tensor]:
        ids = torch.full((1, max(target.seq_len, len(tokens))), target.pad_id, dtype=torch.long)
        ids[0, :len(tokens)] = torch.tensor(tokens)
        mask = (ids != target.pad_id) | (torch.arange(ids.shape[1]) < len(tokens))
        update = target.replay(embeddings[ids.to(embeddings.device)], mask.long().to(device),
                               torch.tensor([label], device=device))
        sign = -1.0 if target.update_kind == "delta" else 1.0
        return {n: sign * u.detach().to(device) for n, u in zip(names, update, strict=True)}

    return gradient
