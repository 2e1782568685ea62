# Two commands do all the set-up on a fresh machine (see README.md):
#   make demo   install everything into .venv and run the main job on bundled data
#   make test   install everything into .venv and run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: install demo test lint protos bench

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first, pinned: a bare `torch` would pull a multi-GB CUDA build on a CPU machine.
	$(PIP) install -c constraints.txt torch==2.13.0
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
