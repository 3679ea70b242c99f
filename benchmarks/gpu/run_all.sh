#!/usr/bin/env bash
# Every GPU measurement of mutualrl in one command, for the minutes a lent device lasts (issue #43).
#
# On a lent device (the device tool's `run`; nothing can be downloaded there, the image has torch,
# transformers, grpcio, protobuf and prometheus-client):
#   here, once:  make gpu-wheels          # the missing wheels into benchmarks/gpu/wheels (ignored, ~15 MB)
#   there:       run(command="bash benchmarks/gpu/run_all.sh", carry=["gen", "benchmarks/gpu/wheels"],
#                    timeout_s=540)
#   then record $OUT/gpu.json's figures in docs/results/gpu.md.
# Here and in `make test`:
#   bash benchmarks/gpu/run_all.sh --dry-run   # the same code paths on the CPU with tiny models (~1 min)
#
# It installs the carried wheels (--no-index, --no-deps: each wheel is one the image lacks), puts this
# checkout's sources on PYTHONPATH (no build step there), then runs benchmarks/gpu/run_all.py: each
# section in its own guard, the JSON rewritten after each with the traceback of any that failed, all
# within --budget-s (default 480 s, the wheels' install included).
set -uo pipefail
cd "$(dirname "$0")/../.."
START=$(date +%s)
DRY=""
ARGS=()
for a in "$@"; do
  if [ "$a" = "--dry-run" ]; then DRY=1; fi
  ARGS+=("$a")
done
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ] && [ -n "$DRY" ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT=${OUT:-benchmarks/gpu/out}
mkdir -p "$OUT"
WHEELS=benchmarks/gpu/wheels
if [ -z "$DRY" ] && [ -d "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  echo "installing $(ls "$WHEELS"/*.whl | wc -l) carried wheels"
  "$PY" -m pip install -q --no-index --no-deps --find-links "$WHEELS" "$WHEELS"/*.whl 2>&1 | tail -3
fi
SRC="$PWD/gen"
for d in libs/*/src services/src app/src; do SRC="$SRC:$PWD/$d"; done
export PYTHONPATH="$SRC${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "$PY" benchmarks/gpu/run_all.py --json "$OUT/gpu.json" --started "$START" "${ARGS[@]}"
