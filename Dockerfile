# syntax=docker/dockerfile:1
# One image for every mutualrl service (`mutualrl serve rollout|learner`, `mutualrl controller`).
#   docker build --build-arg FLAVOR=cpu  -t mutualrl:cpu  .   # CPU torch: laptops, docker-compose, CI
#   docker build --build-arg FLAVOR=cuda --build-arg ENGINE=vllm -t mutualrl:cuda .   # GPU clusters
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ARG FLAVOR=cpu
ARG ENGINE=vllm
# the engine client the cuda image carries: the same release as the chart's engine sidecar images
# (vllm/vllm-openai:v0.10.2, lmsysorg/sglang:v0.5.2; a deploy test holds them equal)
ARG VLLM_VERSION=0.10.2
ARG SGLANG_VERSION=0.5.2
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
RUN python -m venv /opt/venv && pip install "pip==24.3.1" "setuptools==75.6.0" "wheel==0.45.1"
# torch first: the CPU wheel for `cpu`; for `cuda` the engine extra brings the torch it pins
COPY constraints-cpu.txt pyproject.toml README.md ./
RUN if [ "$FLAVOR" = "cpu" ]; then \
        pip install -c constraints-cpu.txt --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"; \
    elif [ "$FLAVOR" != "cuda" ]; then echo "FLAVOR must be cpu or cuda, got $FLAVOR" >&2; exit 1; fi
COPY proto ./proto
COPY libs ./libs
COPY services ./services
COPY app ./app
# protobuf code is generated here, never committed (grpcio-tools pinned with grpcio/protobuf)
RUN pip install -c constraints-cpu.txt "grpcio-tools==1.85.1" \
    && mkdir -p gen \
    && python -m grpc_tools.protoc -I proto --python_out=gen --grpc_python_out=gen --pyi_out=gen proto/mutualrl/v1/*.proto \
    && touch gen/mutualrl/v1/__init__.py
# The real extra (gguf, accelerate, reasoning-gym) lets `mutualrl models get` convert presets on a
# read-only root and runs reasoning-gym tasks.
# DL3013: this installs the project itself; its dependencies are pinned by constraints-cpu.txt
# (cpu) or by the engine release pinned above and that release's own pins (cuda)
# hadolint ignore=DL3013
RUN if [ "$FLAVOR" = "cpu" ]; then pip install -c constraints-cpu.txt ".[real]"; \
    elif [ "$ENGINE" = "vllm" ]; then pip install ".[real,vllm]" "vllm==${VLLM_VERSION}"; \
    elif [ "$ENGINE" = "sglang" ]; then pip install ".[real,sglang]" "sglang==${SGLANG_VERSION}"; \
    else echo "ENGINE must be vllm or sglang, got $ENGINE" >&2; exit 1; fi

FROM python:${PYTHON_VERSION}-slim-bookworm AS runtime
ARG FLAVOR=cpu
LABEL org.opencontainers.image.title="mutualrl" org.opencontainers.image.description="Mutual RL services (${FLAVOR})" \
      org.opencontainers.image.licenses="Apache-2.0"
# DL3064: TOKENIZERS_PARALLELISM is a switch of the tokenizers library, not a secret token
# hadolint ignore=DL3064
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HOME=/data/hf \
    MUTUALRL_CACHE=/data/cache MUTUALRL_OPS_PORT=9000
RUN groupadd --system --gid 10001 mutualrl && useradd --system --uid 10001 --gid mutualrl --home-dir /data --no-create-home mutualrl \
    && mkdir -p /data /weights /etc/mutualrl && chown -R mutualrl:mutualrl /data /weights
COPY --from=build /opt/venv /opt/venv
USER 10001:10001
WORKDIR /data
EXPOSE 9000 50051 8080
# every service answers /healthz on its ops port (the controller's API port: set MUTUALRL_OPS_PORT=8080)
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('MUTUALRL_OPS_PORT', '9000'), timeout=4)"]
ENTRYPOINT ["mutualrl"]
CMD ["--help"]
