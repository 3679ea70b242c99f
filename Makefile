# Two commands on a fresh machine: `make demo` and `make test`. Both run `setup`
# first, which is idempotent and quick when nothing changed.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
GEN_STAMP := gen/.generated
PROTOS := $(wildcard proto/mutualrl/v1/*.proto)
CONFIG ?= examples/demo.yaml
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test test-slow bench proto clean

setup: $(STAMP) $(GEN_STAMP)

$(VENV)/bin/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip "setuptools>=69" wheel

# Install deps (torch pinned to the CPU wheel) before the editable install,
# which needs the generated package directory to exist.
$(STAMP): $(VENV)/bin/python pyproject.toml constraints-cpu.txt
	$(BIN)/pip install -q -c constraints-cpu.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints-cpu.txt grpcio-tools
	$(MAKE) --no-print-directory $(GEN_STAMP)
	$(BIN)/pip install -q -c constraints-cpu.txt --no-build-isolation -e ".[dev]"
	touch $@

$(GEN_STAMP): $(PROTOS) | $(VENV)/bin/python
	rm -rf gen && mkdir -p gen
	$(BIN)/python -m grpc_tools.protoc -I proto --python_out=gen --grpc_python_out=gen --pyi_out=gen $(PROTOS)
	touch gen/mutualrl/v1/__init__.py
	touch $@

proto: $(GEN_STAMP)

demo: setup
	$(BIN)/mutualrl run $(CONFIG)

test: setup
	$(BIN)/python -m pytest -q -m "not slow" tests

test-slow: setup
	$(BIN)/python -m pytest -q -m slow tests

bench: setup
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf gen $(VENV) .pytest_cache
