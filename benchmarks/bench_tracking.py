"""What experiment tracking costs a run: the demo's RL step time with TensorBoard and MLflow on, over the same
run with only ``metrics.jsonl`` (docs/tracking.md). Goal: at most 2 % slower.

The MLflow side is a real ``mlflow server`` on loopback with a SQLite store (the one `make test` installs
into .venv-mlflow). It runs at nice 19 by default, standing for a team's server on other machines; at nice 0
it takes its CPU (~25 ms per request, ~0.8 ms per metric written to SQLite) from the cores training runs on.
The trackers run as a run has them by default, in threads of the training process; a third variant runs
them in a child process at low priority (``tracking.isolation: process``) instead, for the difference. Every
run is in this invocation, interleaved (off, on, process, off, ...) so a drift of the machine hits all; the runs
are identical (same seed, same prompts) but for the trackers. Step time: the summed ``step_s`` of the RL steps
(evaluations excluded, as they are the same in both); the trackers' one-time start (MLflow's experiment, runs
and ~200 parameters) is inside the first step, so it counts. The server is left to settle first: MLflow 3
keeps two cores busy for ~25 s after it answers, which no run should be charged for.

    .venv/bin/python benchmarks/bench_tracking.py [--steps 80] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from mutualrl.app.embedded import run_embedded
from mutualrl.config import load_config
from mutualrl.tracking.local_server import MlflowServer, mlflow_binary

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo.yaml"
GOAL = 1.02


def step_seconds(out: Path) -> float:
    """The summed step time of a run's RL steps (every policy)."""
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return sum(r["step_s"] for r in recs if r.get("phase") != "warm_start" and "step_s" in r)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=80, help="RL steps per run (the demo's 80)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--server-nice", type=int, default=19,
                    help="CPU priority of the MLflow server: 19 stands for a team's server on other machines, as on a "
                         "cluster; 0 makes it take its CPU from the same cores as training")
    args = ap.parse_args()
    if not mlflow_binary().exists():
        print(f"no MLflow server at {mlflow_binary()}: `make test` (or `make bench`) installs it into .venv-mlflow")
        return 1
    common = [f"budget.steps={args.steps}", f"eval.every={args.steps}", "eval.size=64"]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        server = MlflowServer(tmp).start(nice=args.server_nice)
        print(f"MLflow server idle after {server.settle():.0f} s", flush=True)
        uri = server.uri
        try:
            on = common + ["tracking.backends=[jsonl,tensorboard,mlflow]", f"tracking.mlflow.tracking_uri={uri}"]
            # "on": the trackers in threads of the training process (the default); "process": the same trackers in
            # a child process at nice 10
            variants = {"off": common + ["tracking.backends=[jsonl]"], "on": on,
                        "process": on + ["tracking.isolation=process"]}
            run_embedded(load_config(DEMO, variants["off"] + ["budget.steps=1"]), tmp / "warm")  # caches warm starts
            times: dict[str, list[float]] = {name: [] for name in variants}
            for i in range(args.repeats):
                for name, sets in variants.items():
                    out = tmp / f"{name}-{i}"
                    summary = run_embedded(load_config(DEMO, sets), out)
                    times[name].append(step_seconds(out))
                    sent = {p: t for p, t in (summary.get("tracking") or {}).items()}
                    print(f"{name} #{i}: RL steps {times[name][-1]:.2f} s  trackers {json.dumps(sent)}", flush=True)
        finally:
            server.stop()
    off, on = statistics.mean(times["off"]), statistics.mean(times["on"])
    ratio = on / off
    process = statistics.mean(times["process"]) / off
    print(f"\ndemo, {args.steps} steps x {args.repeats} repeats, MLflow server at nice {args.server_nice}: "
          f"step time with tensorboard+mlflow {on:.2f} s, "
          f"without {off:.2f} s: ratio {ratio:.3f} (goal <= {GOAL}) -> {'ok' if ratio <= GOAL else 'MISSED'}; "
          f"the same trackers in a child process: {process:.3f}")
    return 0 if ratio <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
