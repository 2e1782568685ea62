"""The second span's input at position i for every one-token extension of causal prefixes.

DAGER's decoder search (Petrov et al. 2024) extends each recovered prefix
``x_{<i}`` by every token c of the position's candidate set and keeps the extensions whose
second-layer input at position i, ``h_i(x_{<i} c)``, lies in the span. In a causal model
``h_i`` depends on the prefix only through the first layer's keys and values at positions < i,
which every extension shares: they are computed once per prefix (the model's key/value cache,
repeated for the C candidates), and only position i is run per candidate — C·P one-token
forwards instead of C·P sequences of i + 1 tokens. A model that returns no cache
(``past_key_values``) is run on the whole sequences instead; the result is the same.
"""

from __future__ import annotations

import torch

from fedleak.attacks.text.transformer_layout import TransformerLayout, captured_input, part

#: sequences run at once (a prefix's candidates are never split)
CHUNK = 2048


def extension_inputs(layout: TransformerLayout, prefixes: torch.Tensor,
                     candidates: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """Return ``h_i`` of the second span layer for ``prefixes`` extended by ``candidates``.

    ``h_i`` of the second span layer for ``prefixes`` [P, i] extended by each of ``candidates`` [C]:
    [P, C, d].
    """
    count, length = prefixes.shape
    width = candidates.numel()
    module = layout.layers[1].module
    if length == 0:
        inputs = layout.model_inputs(candidates[:, None])
        return captured_input(layout.model, module, inputs)[:, 0].unsqueeze(0)
    per_chunk = max(1, chunk // max(width, 1))
    out = []
    for start in range(0, count, per_chunk):
        block = prefixes[start:start + per_chunk]
        out.append(_extend(layout, block, candidates))
    return torch.cat(out, dim=0)


def _extend(layout: TransformerLayout, prefixes: torch.Tensor,
            candidates: torch.Tensor) -> torch.Tensor:
    count, length = prefixes.shape
    width = candidates.numel()
    model = layout.model
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(**layout.model_inputs(prefixes), use_cache=True)
    finally:
        model.train(training)
    cache = part(out, "past_key_values")
    repeat = part(cache, "batch_repeat_interleave")
    module = layout.layers[1].module
    if cache is None or not callable(repeat):
        whole = torch.cat([prefixes.repeat_interleave(width, 0),
                           candidates.repeat(count)[:, None]], dim=1)
        h = captured_input(model, module, layout.model_inputs(whole))[:, length]
        return h.reshape(count, width, -1)
    repeat(width)
    ids = candidates.repeat(count)[:, None]
    inputs = layout.model_inputs(
        ids, position_ids=torch.full_like(ids, length),
        attention_mask=torch.ones(count * width, length + 1, dtype=torch.long))
    inputs["past_key_values"] = cache
    h = captured_input(model, module, inputs)[:, 0]
    return h.reshape(count, width, -1)
