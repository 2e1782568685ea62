"""LAMP and TAG as the registered attacks ``lamp`` and ``tag``.

``lamp`` and ``tag``: LAMP (Balunović et al., NeurIPS 2022, arXiv 2202.08827) and TAG (Deng et al.
2021, arXiv 2103.06819) as registered attacks on a
:class:`~fedleak.attacks.text_observation.TextObservation`.

The engine is :func:`fedleak.attacks.text.lamp.inversion.invert_text` (continuous token embeddings
matched to the update through the user's own replay, projected to tokens; LAMP adds discrete
reordering steps scored with a language-model prior). What the server supplies here, from
what it holds:

- the replay (``TextObservation.replay``) and the update, without the token-embedding entry
  (a replay from embeddings never looks the matrix up: that entry cannot be matched);
- the sentences' layout: every sentence starts with the published start token; their lengths
  are unknown, so every sentence is taken as long as the longest, read off the position
  embedding's gradient (rows of positions no sentence reached stay zero; a decoder's last
  token has no gradient there, so one more);
- the labels: a language model's are its own next tokens (recomputed from each projection);
  a classifier's are counted from its bias gradient (``fedleak.attacks.labels.count_labels``);
- with ``restrict_tokens``, the projection is onto the batch's token set (the ``token-set``
  attack's rows), the honest server's knowledge at no cost — unless the published chain adds
  noise (DP-SGD, client-level DP, noise), which fills every row;
- LAMP's prior: a bigram model counted from the public text the server holds
  (``TextObservation.public_sequences``); without any, the discrete steps use the
  reconstruction loss alone, and the run says so.

The budget is work: ``iterations`` continuous steps (every replay is counted in the result's
evaluations).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch

from fedleak.attacks.attack_registry import register_attack
from fedleak.attacks.base import Progress, UpdateSetting
from fedleak.attacks.labels import count_labels
from fedleak.attacks.observation import Reconstruction
from fedleak.attacks.text.lamp.bigram_prior import BigramPrior
from fedleak.attacks.text.lamp.inversion import LampConfig, invert_text
from fedleak.attacks.text.text_attack import TextAttack
from fedleak.attacks.text.token_set import TokenSet
from fedleak.attacks.text_observation import (
    CLASSIFY,
    DECODER,
    IGNORE_INDEX,
    TextObservation,
    TextReconstruction,
)

#: published defenses whose noise fills every embedding row (no token set to restrict to)
NOISY_DEFENSES = frozenset({"dpsgd", "client-dp", "noise"})


@dataclass
class LampAttackConfig:
    """Options of ``lamp``: the continuous steps, Adam's rate, the objective and the priors."""

    iterations: int = field(default=500, metadata={"help": "continuous optimisation steps"})
    learning_rate: float = field(default=0.01, metadata={"help": "Adam's (cosine-decayed)"})
    objective: str = field(default="cosine", metadata={"help": "cosine (LAMP_cos) or tag"})
    tag_alpha: float = field(default=0.01, metadata={"help": "weight of TAG's L1 term"})
    regulariser: float = field(default=1.0, metadata={"help": "embedding-length weight"})
    prior_weight: float = field(default=0.2, metadata={"help": "α_lm of the bigram prior"})
    discrete_every: int = field(default=50, metadata={
        "help": "continuous steps between discrete reordering steps (0: none)"})
    discrete_candidates: int = field(default=32, metadata={
        "help": "reorderings scored per discrete step"})
    initialisations: int = field(default=4, metadata={
        "help": "random starts scored; the best is optimised"})
    restrict_tokens: bool = field(default=True, metadata={
        "help": "project onto the batch's token set (from the embedding gradient)"})


@dataclass
class TagAttackConfig(LampAttackConfig):
    """Options of ``tag``: LAMP's with TAG's objective (L2 + αL1) and no language prior."""

    objective: str = field(default="tag", metadata={"help": "tag (L2 + αL1) or cosine"})
    regulariser: float = field(default=0.0, metadata={"help": "embedding-length weight"})
    prior_weight: float = field(default=0.0, metadata={"help": "α_lm of the bigram prior"})
    discrete_every: int = field(default=0, metadata={"help": "TAG: continuous steps only"})


@register_attack("lamp")
class Lamp(TextAttack):
    """Gradient matching on token embeddings with a language-model prior."""

    Config: ClassVar[type[Any]] = LampAttackConfig
    architectures: ClassVar[tuple[str, ...]] = ("decoder", "encoder")

    @classmethod
    def unsuited(cls, setting: UpdateSetting) -> str | None:
        """Return None: LAMP and TAG accept any update setting."""
        return None

    def budget(self) -> int | None:
        """Return the continuous optimisation steps."""
        return int(self.config.iterations)

    def engine_config(self, seed: int) -> LampConfig:
        """Return the engine's settings.

        TAG's table defaults are :func:`~fedleak.attacks.text.lamp.inversion.tag_config`'s.
        """
        c = self.config
        return LampConfig(
            iterations=c.iterations, learning_rate=c.learning_rate, objective=c.objective,
            tag_alpha=c.tag_alpha, regulariser=c.regulariser, prior_weight=c.prior_weight,
            discrete_every=c.discrete_every, discrete_candidates=c.discrete_candidates,
            initialisations=c.initialisations, seed=seed)

    def recover(self, target: TextObservation, *, device: torch.device, seed: int,
                progress: Progress | None) -> Reconstruction:
        """Recover the batch's sentences by LAMP's optimisation (module docstring)."""
        warnings: list[str] = []
        config = self.engine_config(seed)
        model: Any = target.model
        vocabulary = model.get_input_embeddings().weight.detach().to(device)
        skip = {target.embedding_name} if target.embedding_name else set()
        keep = [i for i, n in enumerate(target.parameter_names) if n not in skip]
        observed = [target.update[i].to(device) for i in keep]

        def replay(x: torch.Tensor, mask: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
            out = target.replay(x, mask, y)
            return [out[i] for i in keep]

        length = sentence_length(target)
        mask = torch.zeros(target.num_sequences, target.seq_len, dtype=torch.long,
                           device=device)
        mask[:, :length] = 1
        template = torch.full_like(mask, -1)
        if target.start_id is not None:
            template[:, 0] = target.start_id
        labels = self.labels(target, mask)
        allowed = None
        noisy = {d.name for d in target.defenses} & NOISY_DEFENSES
        if noisy and self.config.restrict_tokens:
            warnings.append(f"the published chain adds noise ({', '.join(sorted(noisy))}): the "
                            "token set is not read from it; the projection uses every token")
        if self.config.restrict_tokens and not target.lora and not noisy:
            found = TokenSet().reconstruct(target, device=device)
            assert isinstance(found, TextReconstruction)
            ids = set(found.token_set or []) | {i for i in (target.start_id, target.end_id)
                                                if i is not None}
            allowed = torch.tensor(sorted(ids), device=device)
        prior = None
        if config.prior_weight > 0 and config.discrete_every:
            if target.public_sequences:
                prior = BigramPrior(target.public_sequences, int(vocabulary.shape[0]))
            else:
                warnings.append("no public text to count a language-model prior from: the "
                                "discrete steps score the reconstruction loss alone")
                config = replace(config, prior_weight=0.0)
        result = invert_text(replay, observed, vocabulary, mask, labels, config, prior,
                             template, allowed)
        if progress is not None:
            progress(result.iterations, config.iterations, result.objective)
        sentences = result.sentences(mask.cpu())
        return TextReconstruction(
            sequences=sentences, iterations=result.evaluations, objective=result.objective,
            warnings=warnings, extras={"length": length, "evaluations": result.evaluations,
                                       "token_set": allowed is not None,
                                       "prior": prior is not None})

    def labels(self, target: TextObservation, mask: torch.Tensor) -> Any:
        """Return a decoder's labels from its own tokens; a classifier's counted from the bias."""
        if target.task == CLASSIFY:
            bias = next((n for n in target.parameter_names if n.endswith("classifier.bias")),
                        None)
            if bias is None:
                raise ValueError("the classifier's bias is not in the update: its labels "
                                 "cannot be counted")
            return count_labels(target.gradient(bias), target.num_sequences).to(mask.device)

        def next_tokens(ids: torch.Tensor) -> torch.Tensor:
            out = torch.full_like(ids, IGNORE_INDEX)
            out[:, :-1] = torch.where(mask[:, 1:] > 0, ids[:, 1:], IGNORE_INDEX)
            return out

        return next_tokens


@register_attack("tag")
class Tag(Lamp):
    """TAG: L2 + αL1 gradient matching on token embeddings, continuous steps only."""

    Config: ClassVar[type[Any]] = TagAttackConfig


def sentence_length(target: TextObservation) -> int:
    """Return the longest sentence's length, from the position embedding's gradient.

    The longest sentence's length, from the position embedding's gradient rows (module docstring); T
    when the model has no such parameter in the update.
    """
    name = next((n for n in target.parameter_names
                 if n.endswith(("wpe.weight", "position_embeddings.weight"))), None)
    if name is None:
        return target.seq_len
    rows = target.gradient(name).norm(dim=1)[:target.seq_len]
    used = torch.nonzero(rows > 0).flatten()
    if not len(used):
        return target.seq_len
    extra = 2 if target.architecture == DECODER else 1
    return min(target.seq_len, int(used.max()) + extra)
