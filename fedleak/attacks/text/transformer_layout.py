"""Where DAGER reads a transformer.

The input of its first self-attention layer, the input of a second linear layer that mixes the
sentence, and the weight gradients that span them.

A :class:`TransformerLayout` names two :class:`SpanLayer` s. The first is the first attention's
query/key/value projection (GPT-2's fused ``attn.c_attn``, BERT's ``attention.self.query/key/
value``): its input at position i depends on the token there and i only. The second is a linear
layer whose input depends on the tokens around it: the paper's choice is the second attention
layer's projection (``second="attention"``); the default here is the first block's feed-forward
input (``mlp.c_fc``, ``intermediate.dense``: ``second="feed-forward"``), which holds the same
information about the sentence and, unlike the second attention of a two-layer classifier, is
never the last layer, whose gradient only sees what reaches the pooled token (rank below B·T).
Inputs are captured by a forward pre-hook on the module — whatever the model computes before it
(embedding sum, LayerNorm, attention; dropout off) is the model's own code — and the forward
stops there. :func:`layout_of` builds the layout of a Hugging Face GPT-2 (``GPT2LMHeadModel``,
``GPT2ForSequenceClassification``, ``GPT2Model``) or BERT (``BertForSequenceClassification``,
``BertModel``, ...) by module names, without importing ``transformers``; another architecture
passes its own layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

Kind = Literal["decoder", "encoder"]
Second = Literal["feed-forward", "attention"]


def part(obj: Any, name: str, default: Any = None) -> Any:
    """Return the attribute ``name`` of a Hugging Face module, config or output.

    The attribute ``name`` of a Hugging Face module, config or model output (``default`` where it
    has none). Those classes share no typed interface (GPT-2 keeps its blocks in ``transformer.h``,
    BERT in ``bert.encoder.layer``; outputs carry ``logits`` or a cache or not), so the text attacks
    read the public model's parts by name here, and only here: what they read is the model the
    server sent, never the observation or its replay.
    """
    return getattr(obj, name, default)


class LayoutError(ValueError):
    """The model is not one DAGER knows how to read."""


class _Captured(Exception):
    """Raised by the capture hook to stop the forward once the input is read."""


@dataclass
class SpanLayer:
    """A layer as DAGER reads it.

    The module whose input is captured and the names of the weights whose gradients span that input,
    each with whether it stores the input dimension first (``Conv1D``: [n_in, n_out]) or last
    (``nn.Linear``: [n_out, n_in]).
    """

    module: nn.Module
    weights: tuple[str, ...]
    input_first: tuple[bool, ...]

    def gradients(self, gradients: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """Return the layer's weight gradients from ``gradients`` (by parameter name).

        Each is given with the input dimension first.
        """
        out = []
        for name, first in zip(self.weights, self.input_first, strict=True):
            if name not in gradients:
                raise LayoutError(f"the update has no gradient for {name!r} (it names "
                                  f"{len(gradients)} parameters); DAGER reads the first "
                                  "attention's query/key/value weights and a second layer's")
            g = gradients[name]
            out.append(g if first else g.T)
        return out


@dataclass
class TransformerLayout:
    """Where DAGER reads a decoder or an encoder.

    A decoder (causal: position i sees tokens ≤ i) or encoder (every position sees the whole
    sentence) and where DAGER reads it. ``token_type_id`` is passed as ``token_type_ids`` to models
    that take it (BERT); ``final_norm``/``final_norm_weights``/``head`` are a causal language
    model's last LayerNorm, its (weight, bias) parameter names and the output embedding [V, d]: the
    last token of each sentence is read from their gradients.
    """

    model: nn.Module
    kind: Kind
    layers: tuple[SpanLayer, SpanLayer]
    vocab_size: int
    hidden_size: int
    max_positions: int
    token_type_id: int | None = None
    final_norm: nn.Module | None = None
    final_norm_weights: tuple[str, str] | None = None
    head: torch.Tensor | None = None
    extra_inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def token_embeddings(self) -> torch.Tensor:
        """The input token embedding matrix [V, d] (``get_input_embeddings().weight``)."""
        getter = part(self.model, "get_input_embeddings")
        embedding = getter() if callable(getter) else None
        if not isinstance(embedding, nn.Embedding):
            raise LayoutError("the model has no get_input_embeddings() returning nn.Embedding")
        return embedding.weight

    @property
    def next_token(self) -> bool:
        """Whether the model is a causal language model (loss on the next token)."""
        return self.head is not None

    def model_inputs(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                     attention_mask: torch.Tensor | None = None) -> dict[str, Any]:
        """Return the model's forward keyword arguments for ``input_ids``.

        Keyword arguments of the model's forward for ``input_ids`` [N, t] (token ids, or input
        embeddings [N, t, d] passed as ``inputs_embeds``), on the model's device.
        """
        device = self.device
        key = "inputs_embeds" if input_ids.is_floating_point() else "input_ids"
        kwargs: dict[str, Any] = {key: input_ids.to(device), **self.extra_inputs}
        if position_ids is not None:
            kwargs["position_ids"] = position_ids.to(device)
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.to(device)
        if self.token_type_id is not None:
            kwargs["token_type_ids"] = torch.full(input_ids.shape[:2], self.token_type_id,
                                                  dtype=torch.long, device=device)
        return kwargs

    @property
    def device(self) -> torch.device:
        """Where the model's parameters live."""
        for parameter in self.model.parameters():
            return parameter.device
        return torch.device("cpu")

    def layer_inputs(self, layer: int, input_ids: torch.Tensor,
                     position_ids: torch.Tensor | None = None,
                     attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Return the input of attention layer ``layer`` for the sentences ``input_ids``.

        The input of attention layer ``layer`` (0 or 1) for the sentences ``input_ids`` [N, t]
        (dropout off, no gradient): [N, t, d].
        """
        return captured_input(self.model, self.layers[layer].module,
                              self.model_inputs(input_ids, position_ids, attention_mask))


def captured_input(model: nn.Module, module: nn.Module, inputs: Mapping[str, Any],
                   graph: bool = False) -> torch.Tensor:
    """Capture what ``module`` receives when ``model(**inputs)`` runs.

    What ``module`` receives when ``model(**inputs)`` runs, in evaluation mode (no dropout); the
    forward stops at ``module``. Without a graph unless ``graph`` (then the result is differentiable
    with respect to ``inputs_embeds``).
    """
    store: list[torch.Tensor] = []

    def hook(_: nn.Module, args: tuple[Any, ...]) -> None:
        store.append(args[0] if graph else args[0].detach())
        raise _Captured

    handle = module.register_forward_pre_hook(hook)
    training = model.training
    model.eval()
    try:
        with torch.set_grad_enabled(graph):
            model(**inputs)
    except _Captured:
        pass
    finally:
        handle.remove()
        model.train(training)
    if not store:
        raise LayoutError("the model's forward never reached the attention layer DAGER reads")
    return store[0]


def _child(module: nn.Module, path: str) -> nn.Module | None:
    for step in path.split("."):
        nxt = part(module, step)
        if not isinstance(nxt, nn.Module):
            return None
        module = nxt
    return module


def _prefix(model: nn.Module, module: nn.Module) -> str:
    for name, candidate in model.named_modules():
        if candidate is module:
            return str(name)
    raise LayoutError("a layer DAGER reads is not a submodule of the model")


def _config_int(model: nn.Module, *names: str) -> int:
    config = part(model, "config")
    for name in names:
        value = part(config, name)
        if isinstance(value, int):
            return value
    raise LayoutError(f"the model's config has none of {names}")


def _span_layer(model: nn.Module, modules: list[nn.Module | None], where: str) -> SpanLayer:
    """Return the layer reading the input of ``modules[0]`` (all of them read the same input)."""
    found = [m for m in modules if m is not None]
    if not found or len(found) != len(modules):
        raise LayoutError(f"the model has no {where}")
    names = tuple(_prefix(model, m) + ".weight" for m in found)
    return SpanLayer(found[0], names, tuple(not isinstance(m, nn.Linear) for m in found))


def layout_of(model: nn.Module, second: Second = "feed-forward") -> TransformerLayout:
    """Return the layout of a Hugging Face GPT-2 or BERT model, found by module names.

    LayoutError naming what is missing otherwise (pass a :class:`TransformerLayout` of your own).
    ``second`` picks the second span (module docstring).
    """
    if second not in ("feed-forward", "attention"):
        raise LayoutError(f"second must be 'feed-forward' or 'attention'; got {second!r}")
    blocks = _child(model, "transformer.h") or _child(model, "h")
    layers = _child(model, "bert.encoder.layer") or _child(model, "encoder.layer")
    depth = 2 if second == "attention" else 1
    if isinstance(blocks, nn.ModuleList) and len(blocks) >= depth:
        return _gpt2_layout(model, blocks, second)
    if isinstance(layers, nn.ModuleList) and len(layers) >= depth:
        return _bert_layout(model, layers, second)
    raise LayoutError(
        f"{type(model).__name__} is neither a GPT-2 (transformer.h) nor a BERT "
        f"(bert.encoder.layer) with at least {depth} layer(s); pass a TransformerLayout naming "
        "the layers DAGER reads")


def _gpt2_layout(model: nn.Module, blocks: nn.ModuleList, second: Second) -> TransformerLayout:
    first = _span_layer(model, [_child(blocks[0], "attn.c_attn")], "attn.c_attn in block 0")
    if second == "attention":
        other = _span_layer(model, [_child(blocks[1], "attn.c_attn")], "attn.c_attn in block 1")
    else:
        other = _span_layer(model, [_child(blocks[0], "mlp.c_fc")], "mlp.c_fc in block 0")
    head: torch.Tensor | None = None
    final_norm: nn.Module | None = None
    norm_weights: tuple[str, str] | None = None
    lm_head = part(model, "lm_head")
    if isinstance(lm_head, nn.Linear):
        head = lm_head.weight
        final_norm = _child(model, "transformer.ln_f")
        if final_norm is None:
            raise LayoutError("a GPT-2 language model without transformer.ln_f")
        name = _prefix(model, final_norm)
        norm_weights = (name + ".weight", name + ".bias")
    return TransformerLayout(
        model=model, kind="decoder", layers=(first, other),
        vocab_size=_config_int(model, "vocab_size"),
        hidden_size=_config_int(model, "n_embd", "hidden_size"),
        max_positions=_config_int(model, "n_positions", "max_position_embeddings"),
        final_norm=final_norm, final_norm_weights=norm_weights, head=head)


def _bert_layout(model: nn.Module, layers: nn.ModuleList, second: Second) -> TransformerLayout:
    def qkv(layer: nn.Module) -> list[nn.Module | None]:
        return [_child(layer, "attention.self." + p) for p in ("query", "key", "value")]

    first = _span_layer(model, qkv(layers[0]), "attention.self.query/key/value in layer 0")
    if second == "attention":
        other = _span_layer(model, qkv(layers[1]), "attention.self.query/key/value in layer 1")
    else:
        other = _span_layer(model, [_child(layers[0], "intermediate.dense")],
                            "intermediate.dense in layer 0")
    return TransformerLayout(
        model=model, kind="encoder", layers=(first, other),
        vocab_size=_config_int(model, "vocab_size"),
        hidden_size=_config_int(model, "hidden_size"),
        max_positions=_config_int(model, "max_position_embeddings"), token_type_id=0)
