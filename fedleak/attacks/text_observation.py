"""What the server holds after one round of a *text* federation, and a text attack's answer.

What the honest-but-curious server holds after one round of a *text* federation, as a data type, and
what a text attack answers.

The user trains a transformer (:mod:`transformers`: a GPT-2-style decoder language model or a
BERT-style encoder classifier) on a private batch of ``n`` token sequences of ``T`` tokens, and
sends the update. The server holds exactly what a real server holds:

- the model it sent, with θ loaded (``model``: the ``transformers`` model itself, so an attack
  reads its embedding matrix, position embeddings and layers by their usual names);
- the update, by the model's own parameter names (``named_update``), and its kind: ``gradient``
  (FedSGD, ∇_θ L) or ``delta`` (FedAvg, θ_new − θ, which points along −∇_θ L);
- the public facts: n, T, the vocabulary size and special token ids of the published
  tokenizer, the architecture (``decoder`` or ``encoder``), the task (``lm``: next-token
  prediction, the loss the mean cross-entropy over every non-padding next token of the batch;
  ``classify``: one class per sequence, the mean cross-entropy over the n sequences), the
  protocol (local steps, learning rate) and the published defenses;
- ``replay``: the user's local update replayed on candidate *embeddings*, with a graph — the
  same code the user ran (:data:`TextReplayFn`).

Never the private token ids, their lengths or the class labels. Sequences are laid out as the
victim's data set lays them out: ``start_id`` (BOS / CLS) first, then the text's tokens, then
``end_id`` when the text ended before T tokens, right-padded with ``pad_id``. Padding is masked
out of attention and of the loss, so padded positions contribute nothing to the update.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedleak.attacks.observation import Reconstruction
from fedleak.attacks.published import PublishedDefense

#: ``replay(inputs_embeds [B, T, d], attention_mask [B, T], labels) -> update``: the user's
#: local update (one tensor per parameter, ``TextObservation.parameter_names`` order, oriented
#: as the update is: a gradient for FedSGD, a delta for FedAvg) for candidate token embeddings
#: (the rows of the input embedding matrix the model would look up: position and type
#: embeddings are added inside the model), differentiable with respect to ``inputs_embeds``.
#: ``attention_mask`` is 1 for real tokens, 0 for padding. ``labels``: task ``lm``: [B, T]
#: int64, ``labels[b, t]`` the token that follows position t (-100: no loss there, as at
#: padding and the last position); task ``classify``: [B] int64 classes. The embedding matrix
#: itself receives no gradient in a replay from embeddings (it is not looked up).
TextReplayFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], list[torch.Tensor]]

DECODER = "decoder"
ENCODER = "encoder"
ARCHITECTURES = (DECODER, ENCODER)
LANGUAGE_MODEL = "lm"
CLASSIFY = "classify"
TASKS = (LANGUAGE_MODEL, CLASSIFY)
#: the label value the loss ignores (PyTorch's and transformers' ``ignore_index``)
IGNORE_INDEX = -100


@dataclass
class TextObservation:
    """One observed update of a text federation and the public facts a server knows about it.

    ``parameter_names`` are the ``transformers`` model's own names (``model.named_parameters()``
    of the trainable parameters: every parameter, or only the LoRA adapters when the user
    trains adapters), in the order of ``parameters`` (θ as sent) and ``update``.
    ``embedding_name`` names the input token embedding (``transformer.wte.weight``,
    ``bert.embeddings.word_embeddings.weight``; empty when it is not trained, e.g. LoRA), and
    ``tied_head`` says whether the language-model head shares it (its gradient is then the
    sum of both uses).
    """

    parameter_names: list[str]
    parameters: list[torch.Tensor]
    update: list[torch.Tensor]
    update_kind: str
    num_sequences: int
    seq_len: int
    vocab_size: int
    pad_id: int
    architecture: str
    task: str
    num_classes: int
    model: nn.Module
    replay: TextReplayFn
    embedding_name: str = ""
    tied_head: bool = False
    start_id: int | None = None
    end_id: int | None = None
    #: ids that never stand for text (padding, BOS/CLS, EOS/SEP, unknown, mask)
    special_ids: tuple[int, ...] = ()
    local_steps: int = 1
    learning_rate: float | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    defenses: tuple[PublishedDefense, ...] = ()
    #: whether the update trains LoRA adapters (peft) rather than every parameter
    lora: bool = False
    #: public text the server holds, as token ids of the victim's tokenizer (sentences of the
    #: corpus split the victim does not draw from): a language-model prior's counts; empty
    #: when the server has none
    public_sequences: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        """Refuse an unknown architecture or task and per-parameter lists of unequal length."""
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {ARCHITECTURES}, got "
                             f"{self.architecture!r}")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if not (len(self.parameter_names) == len(self.parameters) == len(self.update)):
            raise ValueError("parameter_names, parameters and update must have one entry per "
                             "parameter")

    def index_of(self, name: str) -> int:
        """Where parameter ``name`` sits in ``parameter_names`` (KeyError naming the valid)."""
        try:
            return self.parameter_names.index(name)
        except ValueError:
            raise KeyError(f"no trained parameter {name!r} in the observation (it has "
                           f"{', '.join(self.parameter_names[:6])}"
                           f"{', ...' if len(self.parameter_names) > 6 else ''})") from None

    def gradient(self, name: str) -> torch.Tensor:
        """Return the update of parameter ``name`` oriented like a loss gradient (delta negated)."""
        update = self.update[self.index_of(name)]
        return -update if self.update_kind == "delta" else update

    def named_gradients(self) -> dict[str, torch.Tensor]:
        """Every parameter's update oriented like a loss gradient, by name."""
        return {n: self.gradient(n) for n in self.parameter_names}

    def named_update(self) -> dict[str, torch.Tensor]:
        """Return the update as received, by name."""
        return dict(zip(self.parameter_names, self.update, strict=True))

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """θ as the server sent it, by name."""
        return dict(zip(self.parameter_names, self.parameters, strict=True))

    def text_ids(self) -> torch.Tensor:
        """Return the ids that can stand for text: every vocabulary id but the special ones."""
        keep = torch.ones(self.vocab_size, dtype=torch.bool)
        keep[[i for i in self.special_ids if 0 <= i < self.vocab_size]] = False
        return torch.nonzero(keep).flatten()


@dataclass
class TextReconstruction(Reconstruction):
    """A text attack's answer: token id sequences and/or a recovered token set.

    A text attack's answer: sequences of token ids (each without padding), and/or the set of token
    ids it recovered (with multiplicities where the attack knows them).

    ``sequences[i]`` is one recovered sentence as token ids (special ids may be included;
    the victim's scoring drops them). ``padding`` lists the sentence slots that are
    placeholders (the attack recovered nothing there): they are never counted as recovered.
    ``token_set`` is the recovered set of token ids of the whole batch (None: the attack does
    not state one; the victim then scores the union of ``sequences``), ``token_counts`` how
    often each id of ``token_set`` occurs in the batch, where the attack knows it.
    ``labels`` (inherited) may hold recovered class labels (task ``classify``). The image
    fields of :class:`~fedleak.attacks.observation.Reconstruction` stay empty.
    """

    images: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    labels: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    objective: float = float("nan")
    iterations: int = 0
    sequences: list[list[int]] = field(default_factory=list)
    token_set: list[int] | None = None
    token_counts: dict[int, int] | None = None

    @property
    def has_images(self) -> bool:
        """Return False: a text reconstruction holds no images."""
        return False


def as_token_lists(ids: torch.Tensor, pad_id: int) -> list[list[int]]:
    """Rows of ``ids`` [n, T] as lists of ints without trailing ``pad_id`` (nor negative ids)."""
    rows: list[list[int]] = []
    for row in ids.tolist():
        kept = [int(t) for t in row if int(t) >= 0]
        while kept and kept[-1] == pad_id:
            kept.pop()
        rows.append(kept)
    return rows


def named(model: nn.Module, trainable_only: bool = True) -> Mapping[str, nn.Parameter]:
    """Return the model's parameters by name (the trainable ones by default: LoRA adapters)."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad or not trainable_only}


def describe(observation: TextObservation) -> dict[str, Any]:
    """Return the public facts of an observation in one dictionary (for records and errors)."""
    o = observation
    return {"architecture": o.architecture, "task": o.task, "num_sequences": o.num_sequences,
            "seq_len": o.seq_len, "vocab_size": o.vocab_size, "update_kind": o.update_kind,
            "local_steps": o.local_steps, "lora": o.lora,
            "defenses": [d.spec() for d in o.defenses]}
