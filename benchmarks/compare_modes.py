"""Train the demo task under every sharing mode and baseline, and tabulate held-out accuracy.

    .venv/bin/python benchmarks/compare_modes.py [--steps 80] [--out runs/compare] [--only none,sgt]

Each entry is a full `mutualrl run` of examples/demo.yaml (or a baseline config)
with one seed; the table prints warm-start and final greedy accuracy on the
256 held-out problems per policy, and the step-time ratio to isolated GRPO.
One seed on a tiny task: differences of a few points are within noise.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mutualrl.config import load_config
from mutualrl.app.embedded import run_embedded

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo.yaml"
ENTRIES: dict[str, tuple[Path, list[str]]] = {
    "isolated-grpo": (ROOT / "examples/baselines/isolated-grpo.yaml", []),
    "isolated-gspo": (ROOT / "examples/baselines/isolated-gspo.yaml", []),
    "gspo-x2": (ROOT / "examples/baselines/gspo-x2.yaml", []),
    "naive": (DEMO, ["sharing.mode=naive"]),
    "prp": (DEMO, ["sharing.mode=prp"]),
    "xgrpo": (DEMO, ["sharing.mode=xgrpo"]),
    "sgt": (DEMO, ["sharing.mode=sgt"]),
    "hacpo": (ROOT / "examples/baselines/hacpo.yaml", []),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--out", default="runs/compare")
    ap.add_argument("--only", default="", help="comma-separated subset of: " + ", ".join(ENTRIES))
    args = ap.parse_args()
    names = [n for n in ENTRIES if not args.only or n in args.only.split(",")]
    rows = []
    for name in names:
        path, sets = ENTRIES[name]
        cfg = load_config(path, [*sets, f"budget.steps={args.steps}"])
        t0 = time.monotonic()
        summary = run_embedded(cfg, Path(args.out) / name)
        wall = time.monotonic() - t0
        rows.append((name, summary, wall))
        print(json.dumps({"entry": name, "wall_s": round(wall, 1), **{p: (v["warm_start_accuracy"], v["final_accuracy"]) for p, v in summary["policies"].items()}}), flush=True)
    policies = list(rows[0][1]["policies"]) if rows else []
    print("\n| entry | " + " | ".join(f"{p} start → final" for p in policies) + " | mean final | wall s |")
    print("|---|" + "---|" * (len(policies) + 2))
    for name, summary, wall in rows:
        cells = [f"{summary['policies'][p]['warm_start_accuracy']:.1%} → {summary['policies'][p]['final_accuracy']:.1%}" for p in policies]
        mean = sum(summary["policies"][p]["final_accuracy"] for p in policies) / len(policies)
        print(f"| {name} | " + " | ".join(cells) + f" | {mean:.1%} | {wall:.0f} |")


if __name__ == "__main__":
    main()
