"""`make demo`'s run over many seeds: does every policy end above its warm start — the final
checkpoint, not the best one — in every seed, and how long does a run take?

    .venv/bin/python benchmarks/bench_demo.py [--seeds 10] [--start 0] [--config examples/demo.yaml] [--out
    runs/bench-demo] [--set key=value ...]

Goal (the evidence issue): every policy >= 5 points above its warm start in every seed, each run
within the demo's 2–3 minute budget after setup. Runs already finished under ``--out`` are reused,
so an interrupted benchmark resumes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mutualrl.app.embedded import run_embedded
from mutualrl.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--start", type=int, default=0,
                    help="First seed (run seeds start .. start+seeds-1; split a sweep over processes).")
    ap.add_argument("--config", default=str(ROOT / "examples" / "demo.yaml"))
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench-demo"))
    ap.add_argument("--min-gain", type=float, default=0.05)
    ap.add_argument("--set", action="append", default=[],
                    help="Override a config field (repeatable), as `mutualrl run --set`.")
    args = ap.parse_args()
    rows = []
    for seed in range(args.start, args.start + args.seeds):
        d = Path(args.out) / f"seed{seed}"
        summary = d / "summary.json"
        t = time.perf_counter()
        if not summary.is_file():
            run_embedded(load_config(Path(args.config), [*args.set, f"seed={seed}"]), d, reporter=None)
        wall = time.perf_counter() - t
        pols = json.loads(summary.read_text())["policies"]
        gains = {name: p["final_accuracy"] - p["warm_start_accuracy"] for name, p in pols.items()}
        rows.append((seed, wall, {n: (p["warm_start_accuracy"], p["final_accuracy"]) for n, p in pols.items()}, gains))
        moved = "  ".join(f"{n} {a:.1%} -> {b:.1%} ({gains[n] * 100:+.1f})" for n, (a, b) in rows[-1][2].items())
        print(f"seed {seed:2d}  {wall:6.0f} s  " + moved, flush=True)
    worst = min(g for _, _, _, gains in rows for g in gains.values())
    below = [(s, n) for s, _, _, gains in rows for n, g in gains.items() if g < args.min_gain]
    print(f"\nworst gain over {len(rows)} seeds: {worst * 100:+.1f} points (goal >= {args.min_gain * 100:.0f}); below "
          f"the goal: {below or 'none'}")
    fresh = [w for _, w, _, _ in rows if w > 1]
    if fresh:
        print(f"run time: mean {sum(fresh) / len(fresh):.0f} s, max {max(fresh):.0f} s (goal <= 180 s)")
    return 0 if not below else 1


if __name__ == "__main__":
    raise SystemExit(main())
