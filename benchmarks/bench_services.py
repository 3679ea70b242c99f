"""Steps per second of `mutualrl up` (every service its own process, Redis, gRPC) against
`mutualrl run` (one process, in-process SEE) on the same config, in one run. Goal: ratio >= 0.8.

Throughput is measured between the first and the last training step (from the wall-clock
time each step's record was written), so model loading, warm start (cached) and process
start-up are excluded from both.

    .venv/bin/python benchmarks/bench_services.py [--steps 12] [--config examples/demo.yaml]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from mutualrl.app.embedded import run_embedded
from mutualrl.app.launcher import run_services
from mutualrl.config import load_config


def steps_per_second(metrics: Path) -> float:
    recs = [json.loads(l) for l in metrics.read_text().splitlines()]
    by_step: dict[int, float] = {}
    for r in recs:
        if r.get("phase") == "warm_start" or "wall_time" not in r:
            continue
        # a step ends when its slowest policy ends
        by_step[r["step"]] = max(by_step.get(r["step"], 0.0), r["wall_time"])
    steps = sorted(by_step)
    return (len(steps) - 1) / (by_step[steps[-1]] - by_step[steps[0]])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "examples" / "demo.yaml"))
    args = ap.parse_args()
    sets = [f"budget.steps={args.steps}", "eval.every=1000", "eval.size=16"]
    with tempfile.TemporaryDirectory() as tmp:
        embedded = Path(tmp) / "embedded"
        run_embedded(load_config(args.config, sets), embedded)
        services = Path(tmp) / "services"
        rc, _ = run_services(load_config(args.config, sets), services, echo=lambda line: None)
        if rc != 0:
            raise SystemExit(f"mutualrl up failed with {rc}; logs were in {services / 'logs'}")
        e, s = steps_per_second(embedded / "metrics.jsonl"), steps_per_second(services / "metrics.jsonl")
    print(f"{args.steps} steps of {Path(args.config).name}")
    print(f"embedded (mutualrl run): {e:.3f} steps/s")
    print(f"services (mutualrl up):  {s:.3f} steps/s")
    print(f"ratio services/embedded: {s / e:.2f} (goal >= 0.8)")


if __name__ == "__main__":
    main()
