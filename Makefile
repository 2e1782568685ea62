# Two commands do all the set-up on a fresh machine (see README.md):
#   make demo   install everything into .venv and run the main job on bundled data
#   make test   install everything into .venv and run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Which torch build: TORCH=cpu (default) takes torch 2.13.0+cpu from PyTorch's CPU index (or a
# local wheel) and never pulls CUDA wheels; TORCH=cuda takes PyPI's Linux wheel, the CUDA build
# (several GB with its nvidia-* packages), for a GPU machine.
TORCH ?= cpu
TORCH_FROM_cpu := --extra-index-url https://download.pytorch.org/whl/cpu
TORCH_FROM_cuda :=

.PHONY: install demo test lint protos bench

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first, pinned, from the build TORCH names: a bare `torch` would pull the CUDA build.
	$(PIP) install -c constraints.txt $(TORCH_FROM_$(TORCH)) torch==2.13.0
	$(PIP) install -c constraints.txt -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/fedleak demo

test: lint
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check fedleak tests bench examples
	$(VENV)/bin/mypy

protos: install
	$(PY) -m fedleak.harness.wire.protogen

bench: install
	$(PY) bench/attack_speed.py
	$(PY) bench/transport.py
	$(PY) bench/sweep_quick.py
