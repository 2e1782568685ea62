"""Transformers for text federations, built from ``transformers`` configs, never downloaded.

Names (``name:key=value,...`` as for image models):

- ``gpt2``: a GPT-2-style decoder language model (``GPT2LMHeadModel``), options ``hidden``
  (default 256), ``layers`` (2), ``heads`` (4), ``tied`` (false: the LM head has its own
  matrix; true ties it to the token embedding as GPT-2 does), ``positions`` (default the
  data's sequence length);
- ``bert``: a BERT-style encoder classifier (``BertForSequenceClassification``) over the data
  set's classes, options ``hidden``, ``layers``, ``heads``, ``positions``;
- ``minilm``, ``smollm2-135m``: pretrained models that ship inside registry packages
  (:mod:`fedleak.harness.zoo.text.pretrained`): all-MiniLM-L6-v2's BERT encoder under a fresh
  classification head, and SmolLM2-135M-Instruct's llama decoder (its GGUF dequantised to
  float32), each with its own tokenizer; no option but the common ones;
- ``hf``: a local Hugging Face model folder, option ``path`` (``config.json`` and weights, a
  ``*ForCausalLM`` decoder or a ``*ForSequenceClassification`` encoder; a classifier's head is
  re-initialised when its class count differs).

Every model also takes ``lora=R`` (and ``lora-alpha``, default 2R): the user trains rank-R LoRA
adapters (``peft``) on the attention projections, and only the adapters (plus a classifier's
head) are parameters — the frozen base weights become buffers, so updates carry adapters only,
as LoRA federations send them. Or ``train-layers=N``: the user fine-tunes the first N
transformer blocks and the small parameters outside the blocks (the final norm, positions, a
classifier's head) in full; the other blocks and the vocabulary matrices (token embedding, LM
head) are frozen into buffers, so an update carries the first blocks' full weight gradients — what
DAGER and the token-set span read, which LoRA adapters hide — at a fraction of the model's size.
Hidden sizes of 768 and more work as well as small ones.

Randomly initialised from the seed the caller set (``torch.manual_seed``); dropout is 0 (the
user's local training is then a function the server can replay), attention the ``eager``
implementation (it has double derivatives and runs under ``torch.func.vmap``: DP-SGD's
per-example gradients). Set ``HF_HUB_OFFLINE``: nothing is ever fetched.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from torch import nn

from fedleak.harness.zoo.model_spec import ModelError, ModelSpec
from fedleak.harness.zoo.text.pretrained import PRETRAINED_MODELS, pretrained_folder
from fedleak.harness.zoo.text.text_datasets import CLASSIFY, LANGUAGE_MODEL, TextInfo, content_mask
from fedleak.harness.zoo.text.tokenizer import TEXT_EXTRA

TEXT_MODELS = ("gpt2", "bert", "minilm", "smollm2-135m", "hf")
_OPTIONS = {"gpt2": ("hidden", "layers", "heads", "tied", "positions"),
            "bert": ("hidden", "layers", "heads", "positions"), "hf": ("path", "task"),
            "minilm": (), "smollm2-135m": ()}
_COMMON = ("lora", "lora-alpha", "train-layers", "opacus")
_DROPOUTS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout_prob",
             "attention_probs_dropout_prob", "classifier_dropout", "summary_first_dropout",
             "dropout", "attention_dropout")
#: the attention projections LoRA adapts, by model family
_LORA_TARGETS = {"gpt2": ["c_attn"], "bert": ["query", "value"],
                 "llama": ["q_proj", "v_proj"]}
_PREFIX = "net."


def offline() -> None:
    """Forbid every download by ``transformers`` / ``huggingface_hub`` in this process, and
    say how to install them when they are missing."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ModelError(f"text models need the text extra ({TEXT_EXTRA})") from None


def text_model_options(name: str) -> tuple[str, ...]:
    """The ``key=value`` options text model ``name`` takes."""
    if name not in TEXT_MODELS:
        raise ModelError(f"unknown text model {name!r}; choose one of {', '.join(TEXT_MODELS)}")
    return (*_OPTIONS[name], *_COMMON)


def is_text_model(spec: ModelSpec | str) -> bool:
    name = spec.name if isinstance(spec, ModelSpec) else ModelSpec.parse(spec).name
    return name in TEXT_MODELS


class TextModel(nn.Module):
    """A ``transformers`` model seen as fedleak's models are: one input tensor in, logits out.

    The input is token ids ``[B, T]`` (int64; padding, the trailing run of ``pad_id``, is
    masked out), or candidate token embeddings with the attention mask as one more feature,
    ``[B, T, d + 1]`` (float: the replay of :mod:`fedleak.harness.federated.text_replay`).
    Attention gets an explicit additive mask (causal for a decoder), so no data-dependent
    branch runs and ``torch.func.vmap`` applies. Output: task ``lm`` ``[B, V, T]`` (classes on
    dim 1, as ``cross_entropy`` takes them against ``[B, T]`` labels), task ``classify``
    ``[B, C]``: the user's loss is the same ``cross_entropy`` as for images.
    """

    def __init__(self, net: nn.Module, architecture: str, task: str, pad_id: int,
                 family: str) -> None:
        super().__init__()
        self.net: Any = net  # a transformers PreTrainedModel (or peft PeftModel)
        self.architecture = architecture
        self.task = task
        self.pad_id = pad_id
        self.family = family

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if inputs.is_floating_point():
            embeds, mask = inputs[..., :-1], inputs[..., -1]
            out = self.net(inputs_embeds=embeds, attention_mask=self.additive_mask(mask, embeds))
        else:
            mask = content_mask(inputs, self.pad_id)
            out = self.net(input_ids=inputs, attention_mask=self.additive_mask(mask, None))
        logits: torch.Tensor = out.logits
        return logits.transpose(1, 2) if self.task == LANGUAGE_MODEL else logits

    def additive_mask(self, mask: torch.Tensor, like: torch.Tensor | None) -> torch.Tensor:
        """``[B, 1, T, T]``: 0 where query t may attend key s, the dtype's minimum elsewhere."""
        dtype = like.dtype if like is not None else self.input_embeddings().weight.dtype
        allowed = mask[:, None, None, :].to(dtype)
        if self.architecture == "decoder":
            steps = mask.shape[-1]
            causal = torch.ones(steps, steps, dtype=dtype, device=mask.device).tril()
            allowed = allowed * causal
        return (1.0 - allowed) * torch.finfo(dtype).min

    def input_embeddings(self) -> nn.Embedding:
        """The token embedding the model looks ids up in."""
        embeddings = self.net.get_input_embeddings()
        assert isinstance(embeddings, nn.Embedding)
        return embeddings

    def hf_name(self, name: str) -> str:
        """The ``transformers`` model's own name for this wrapper's parameter ``name``."""
        return name[len(_PREFIX):] if name.startswith(_PREFIX) else name

    def embedding_name(self) -> str:
        """The trained token embedding's name (wrapper naming), or '' when it is frozen."""
        weight = self.input_embeddings().weight
        return next((n for n, p in self.named_parameters() if p is weight), "")

    def tied_head(self) -> bool:
        """Whether the language-model head shares the token embedding's matrix."""
        head = self.net.get_output_embeddings() if self.task == LANGUAGE_MODEL else None
        return head is not None and head.weight is self.input_embeddings().weight

    def config_json(self) -> str:
        """The ``transformers`` config as JSON: the public architecture ``Describe`` sends."""
        config = self.base_config()
        return str(config.to_json_string(use_diff=False))

    def base_config(self) -> Any:
        return self.net.get_base_model().config if hasattr(self.net, "get_base_model") \
            else self.net.config


def build_text_model(spec: ModelSpec | str, info: TextInfo,
                     config_json: str | None = None) -> TextModel:
    """Build text model ``spec`` for ``info`` (the victim), or from a published
    ``config_json`` (the server: the same architecture, whatever folder the victim read)."""
    offline()
    spec = ModelSpec.parse(spec) if isinstance(spec, str) else spec
    if spec.name not in TEXT_MODELS:
        raise ModelError(f"unknown text model {spec.name!r}; choose one of "
                         f"{', '.join(TEXT_MODELS)}")
    options = dict(spec.options)
    unknown = sorted(set(options) - set(_OPTIONS[spec.name]) - set(_COMMON))
    if unknown:
        raise ModelError(f"model {spec.name!r} has no option {unknown}; valid: "
                         f"{', '.join((*_OPTIONS[spec.name], *_COMMON))}")
    tokenizer = info.checked_tokenizer
    if config_json is not None:
        net, family = _from_published(config_json, info.task)
    elif spec.name == "hf":
        net, family = _from_folder(options, info)
    elif spec.name in PRETRAINED_MODELS:
        net, family = _from_package(spec.name, info)
    else:
        net, family = _from_zoo(spec.name, options, info)
    vocab = int(net.get_input_embeddings().num_embeddings)  # type: ignore[operator]
    if vocab < tokenizer.vocab_size:
        raise ModelError(f"model {spec} embeds {vocab} tokens but tokenizer {tokenizer.name} "
                         f"has {tokenizer.vocab_size}; use the model's own tokenizer "
                         "(--tokenizer FOLDER)")
    task = info.task
    architecture = "decoder" if task == LANGUAGE_MODEL else "encoder"
    lora = _int(options, "lora", 0)
    train_layers = _int(options, "train-layers", 0)
    if lora and train_layers:
        raise ModelError(f"model {spec}: give lora or train-layers, not both")
    if lora:
        net = _with_lora(net, family, lora, _int(options, "lora-alpha", 2 * lora), task)
    model = TextModel(net, architecture, task, tokenizer.pad_id, family)
    if train_layers:
        _train_first_blocks(model, train_layers, str(spec))
    if lora or train_layers:
        freeze_into_buffers(model)
    model.train()
    return model


def _int(options: dict[str, str], key: str, default: int) -> int:
    try:
        value = int(options.get(key, default))
    except ValueError:
        raise ModelError(f"model option {key} must be an integer, got {options[key]!r}") from None
    if value < 0:
        raise ModelError(f"model option {key} must be >= 0, got {value}")
    return value


def _quiet(config: Any) -> Any:
    for name in _DROPOUTS:
        if getattr(config, name, None) is not None:
            setattr(config, name, 0.0)
    return config


def _from_zoo(name: str, options: dict[str, str], info: TextInfo) -> tuple[nn.Module, str]:
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        GPT2Config,
        GPT2LMHeadModel,
    )

    hidden, layers = _int(options, "hidden", 256), _int(options, "layers", 2)
    heads = _int(options, "heads", 4)
    positions = _int(options, "positions", info.seq_len)
    if hidden < 1 or layers < 1 or heads < 1 or hidden % heads:
        raise ModelError(f"model {name}: hidden ({hidden}) must be a positive multiple of heads "
                         f"({heads}), layers ({layers}) >= 1")
    if positions < info.seq_len:
        raise ModelError(f"model {name}: positions {positions} < the data's sequence length "
                         f"{info.seq_len}")
    tok = info.checked_tokenizer
    if name == "gpt2":
        if info.task != LANGUAGE_MODEL:
            raise ModelError("gpt2 is a language model: serve it with a language-model data "
                             "set (task lm), or use bert for classification")
        tied = options.get("tied", "false").lower()
        if tied not in ("true", "false", "1", "0"):
            raise ModelError(f"model option tied must be true or false, got {tied!r}")
        config = GPT2Config(vocab_size=tok.vocab_size, n_positions=positions, n_embd=hidden,
                            n_layer=layers, n_head=heads, bos_token_id=tok.start_id,
                            eos_token_id=tok.end_id, pad_token_id=tok.pad_id,
                            tie_word_embeddings=tied in ("true", "1"))
        config._attn_implementation = "eager"
        return GPT2LMHeadModel(_quiet(config)), "gpt2"
    if info.task != CLASSIFY:
        raise ModelError("bert is a classifier: serve it with task classify")
    encoder = BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         intermediate_size=4 * hidden, max_position_embeddings=positions,
                         pad_token_id=tok.pad_id)
    encoder.num_labels = info.num_classes
    encoder._attn_implementation = "eager"
    return BertForSequenceClassification(_quiet(encoder)), "bert"


def _auto_class(config: Any, task: str) -> Any:
    import transformers

    return transformers.AutoModelForCausalLM if task == LANGUAGE_MODEL else \
        transformers.AutoModelForSequenceClassification


def _from_folder(options: dict[str, str], info: TextInfo) -> tuple[nn.Module, str]:
    from transformers import AutoConfig

    path = options.get("path")
    if not path or not os.path.isdir(path):
        raise ModelError(f"model hf needs path=FOLDER, a local Hugging Face model folder (got "
                         f"{path!r}); nothing is downloaded")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        if info.task == CLASSIFY:
            config.num_labels = info.num_classes
        auto = _auto_class(config, info.task)
        net = auto.from_pretrained(path, config=_quiet(config), local_files_only=True,
                                   attn_implementation="eager", ignore_mismatched_sizes=True)
    except (OSError, ValueError, KeyError) as err:
        raise ModelError(f"model hf:path={path} cannot be loaded as a "
                         f"{'causal LM' if info.task == LANGUAGE_MODEL else 'classifier'} "
                         f"from local files: {err}") from None
    return net, str(config.model_type)


def _from_package(name: str, info: TextInfo) -> tuple[nn.Module, str]:
    """A pretrained model of :mod:`~fedleak.harness.zoo.text.pretrained` (a classifier's head
    initialised from the caller's seed)."""
    source = PRETRAINED_MODELS[name]
    if info.task != source.task:
        kind = "an encoder classifier" if source.task == CLASSIFY else "a language model"
        raise ModelError(f"model {name} is {kind}: serve it with task {source.task}")
    folder = str(pretrained_folder(name))
    from transformers import AutoConfig

    config = _quiet(AutoConfig.from_pretrained(folder, local_files_only=True))
    if info.task == CLASSIFY:
        config.num_labels = info.num_classes
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # not the load report of the fresh head, every time
    try:
        net = _auto_class(config, info.task).from_pretrained(
            folder, config=config, local_files_only=True, attn_implementation="eager",
            dtype=torch.float32)
    finally:
        logging.set_verbosity(verbosity)
    return net, source.family


def _from_published(config_json: str, task: str) -> tuple[nn.Module, str]:
    from transformers import AutoConfig

    try:
        data = json.loads(config_json)
        model_type = data.pop("model_type")
        config = AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError) as err:
        raise ModelError(f"the published model config cannot be read: {err}") from None
    config._attn_implementation = "eager"
    net = _auto_class(config, task).from_config(_quiet(config), attn_implementation="eager")
    return net, str(model_type)


def _with_lora(net: nn.Module, family: str, rank: int, alpha: int, task: str) -> nn.Module:
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ModelError(f"lora needs peft, in the text extra ({TEXT_EXTRA})") from None

    targets = _LORA_TARGETS.get(family)
    if targets is None:
        raise ModelError(f"lora: no default attention projections for model type {family}; "
                         "use gpt2 or bert")
    save = ["classifier"] if task == CLASSIFY else None
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets,
                        bias="none", modules_to_save=save,
                        fan_in_fan_out=family == "gpt2")  # GPT-2's Conv1D stores Wᵀ
    return get_peft_model(net, config)


def _train_first_blocks(model: TextModel, count: int, spec: str) -> None:
    """Freeze every parameter but the first ``count`` blocks' and those outside the blocks
    that are not vocabulary matrices (``train-layers``, module docstring)."""
    depth = int(model.base_config().num_hidden_layers)
    blocks = next((m for m in model.net.modules()
                   if isinstance(m, nn.ModuleList) and len(m) == depth), None)
    if blocks is None:
        raise ModelError(f"model {spec}: train-layers found no list of its {depth} blocks")
    if count > depth:
        raise ModelError(f"model {spec}: train-layers={count} but the model has {depth} blocks")
    frozen = {id(p) for block in list(blocks)[count:] for p in block.parameters()}
    frozen.add(id(model.input_embeddings().weight))
    head = model.net.get_output_embeddings() if model.task == LANGUAGE_MODEL else None
    if head is not None:
        frozen.add(id(head.weight))
    for parameter in model.parameters():
        if id(parameter) in frozen:
            parameter.requires_grad_(False)


def freeze_into_buffers(model: nn.Module) -> None:
    """Turn every frozen parameter into a buffer of its module (tied ones stay tied)."""
    for module in model.modules():
        for name, parameter in list(module._parameters.items()):
            if parameter is not None and not parameter.requires_grad:
                del module._parameters[name]
                module.register_buffer(name, parameter.data)
