"""What experiment tracking costs a run: the demo's RL step time with TensorBoard and MLflow on, over the same
run with only ``metrics.jsonl`` (docs/tracking.md). Goal: at most 2 % slower.

The MLflow side is a real ``mlflow server`` on loopback with a SQLite store (the one `make test` installs into
.venv-mlflow), so its CPU is paid on the same cores as training, as on a workstation. Every run is in this
invocation, off and on interleaved (off, on, off, on, ...) so a drift of the machine hits both; the runs are
identical (same seed, same prompts) but for the trackers. Step time: the summed ``step_s`` of the RL steps
(evaluations excluded, as they are the same in both).

    .venv/bin/python benchmarks/bench_tracking.py [--steps 12] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from mutualrl.app.embedded import run_embedded
from mutualrl.config import load_config
from mutualrl.see.server import free_port

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo.yaml"
MLFLOW = Path(os.environ.get("MUTUALRL_MLFLOW_SERVER", ROOT / ".venv-mlflow" / "bin" / "mlflow"))
GOAL = 1.02


def start_mlflow(tmp: Path) -> tuple[str, subprocess.Popen]:
    """A real MLflow server on a free loopback port, up and answering."""
    port = free_port()
    proc = subprocess.Popen([str(MLFLOW), "server", "--backend-store-uri", f"sqlite:///{tmp}/mlflow.db",
                             "--artifacts-destination", str(tmp / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"],
                            stdout=open(tmp / "mlflow.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    for _ in range(360):
        try:
            urllib.request.urlopen(uri + "/health", timeout=2)
            return uri, proc
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"the MLflow server did not start; see {tmp / 'mlflow.log'}")


def step_seconds(out: Path) -> float:
    """The summed step time of a run's RL steps (every policy)."""
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return sum(r["step_s"] for r in recs if r.get("phase") != "warm_start" and "step_s" in r)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    if not MLFLOW.exists():
        print(f"no MLflow server at {MLFLOW}: `make test` (or `make bench`) installs it into .venv-mlflow")
        return 1
    common = [f"budget.steps={args.steps}", f"eval.every={args.steps}", "eval.size=64"]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        uri, server = start_mlflow(tmp)
        try:
            variants = {"off": common + ["tracking.backends=[jsonl]"],
                        "on": common + ["tracking.backends=[jsonl,tensorboard,mlflow]",
                                        f"tracking.mlflow.tracking_uri={uri}"]}
            run_embedded(load_config(DEMO, variants["off"] + ["budget.steps=1"]), tmp / "warm")  # caches warm starts
            times: dict[str, list[float]] = {"off": [], "on": []}
            for i in range(args.repeats):
                for name, sets in variants.items():
                    out = tmp / f"{name}-{i}"
                    summary = run_embedded(load_config(DEMO, sets), out)
                    times[name].append(step_seconds(out))
                    sent = {p: t for p, t in (summary.get("tracking") or {}).items()}
                    print(f"{name} #{i}: RL steps {times[name][-1]:.2f} s  trackers {json.dumps(sent)}", flush=True)
        finally:
            os.killpg(server.pid, signal.SIGKILL)
    off, on = statistics.mean(times["off"]), statistics.mean(times["on"])
    ratio = on / off
    print(f"\ndemo, {args.steps} steps x {args.repeats} repeats: step time with tensorboard+mlflow {on:.2f} s, "
          f"without {off:.2f} s: ratio {ratio:.3f} (goal <= {GOAL}) -> {'ok' if ratio <= GOAL else 'MISSED'}")
    return 0 if ratio <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
