"""What does reusing freed tensors' pages buy a real run on the CPU? (mutualrl.runtime.memory.reuse_freed_pages)

The same `mutualrl run` (default: issue #44's pair A, SmolLM2-135M-Instruct + Qwen2.5-Coder-0.5B-Instruct in
bf16-mixed, 4 prompts x 8 samples, 48 new tokens, SGT-R) is run once per arm, each in its own process:
- ``glibc``: glibc's own allocator settings (``MUTUALRL_REUSE_FREED_PAGES=0``, the baseline);
- ``reuse``: the project's (mmap off for allocations, the heap's automatic trim off), with the ``malloc_trim`` after
  each update forced on (``MUTUALRL_RETURN_FREED_MEMORY=1``): what a learner that shares its host does (`up`);
- ``reuse-no-trim``: the same without that trim (``MUTUALRL_RETURN_FREED_MEMORY=0``), which is what `run` does by
  default since 2026-12-05: what the trim costs, in the pages the next update faults in again, against what it
  saves.
Evaluation is cut to a few problems, and step checkpoints are off, so the steps are what is timed.
Printed for each: seconds per step (between the ends of the first and the last step), the CPU seconds in user and
kernel mode, the minor page faults, the peak resident memory of the process tree; then each arm's ratio to the
baseline.

    .venv/bin/python benchmarks/bench_malloc.py [--steps 4] [--arm glibc --arm reuse ...] [--config FILE]
        [--set KEY=VALUE ...] [--json out.json]

Run it alone on the machine: the arms are compared with each other, and anything beside them moves them all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_pair_memory import per_policy  # noqa: E402
from process_memory import run_measured  # noqa: E402

from mutualrl.runtime.memory import RETURN_FREED_MEMORY_ENV, REUSE_FREED_PAGES_ENV  # noqa: E402

CONFIG = ROOT / "examples" / "real" / "sharing" / "pair-a-warm.yaml"
# each arm's allocator switches (mutualrl.runtime.memory); the first arm run is the baseline
ARMS = {
    "glibc": {REUSE_FREED_PAGES_ENV: "0", RETURN_FREED_MEMORY_ENV: "1"},
    "reuse": {REUSE_FREED_PAGES_ENV: "1", RETURN_FREED_MEMORY_ENV: "1"},
    "reuse-no-trim": {REUSE_FREED_PAGES_ENV: "1", RETURN_FREED_MEMORY_ENV: "0"},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--set", action="append", default=[], dest="sets", help="An override of the config (KEY=VALUE).")
    ap.add_argument("--arm", action="append", choices=list(ARMS), default=None, dest="arms",
                    help="The arms to run, in this order (the first is the baseline); all three unless given.")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.steps < 2:
        raise SystemExit("--steps must be at least 2 (seconds per step are timed between step ends)")
    arms = args.arms or list(ARMS)
    if len(arms) < 2:
        raise SystemExit("--arm: name at least two arms (the first is the baseline the others are set against)")
    from mutualrl.config.loading import apply_overrides

    sets = [f"budget.steps={args.steps}", "eval.every=100000", "eval.size=8", "eval.pass_rate_check=false",
            "checkpoint.resume_every=0", *args.sets]
    figures: dict = {"config": str(args.config.resolve().relative_to(ROOT)), "steps": args.steps, "overrides": sets,
                     "threads": os.cpu_count(), "arms": {}}
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        cfg_file = where / "cfg.yaml"
        cfg_file.write_text(yaml.safe_dump(apply_overrides(yaml.safe_load(args.config.read_text()), sets)))
        for arm in arms:
            os.environ.update(ARMS[arm])
            out = where / arm
            res = run_measured([sys.executable, "-m", "mutualrl.app.cli", "run", str(cfg_file), "--out", str(out)],
                               where / f"{arm}.log")
            res.update(per_policy(out / "metrics.jsonl"))
            res.pop("timeline")
            res["env"] = ARMS[arm]
            figures["arms"][arm] = res
            cpu = res["cpu"]
            print(f"{arm}: {res['step_s']:.1f} s/step, user {cpu['user_s']:.0f} s, system {cpu['system_s']:.0f} s, "
                  f"{cpu['minor_faults'] / 1e6:.1f} M minor faults, peak {res['peak_rss_gib']:.1f} GiB resident "
                  f"(wall {res['wall_s']:.0f} s)", flush=True)
    base = figures["arms"][arms[0]]
    figures["ratios"] = {}
    for arm in arms[1:]:
        other = figures["arms"][arm]
        figures["ratios"][arm] = ratio = {
            "step": base["step_s"] / other["step_s"],
            "system": base["cpu"]["system_s"] / max(other["cpu"]["system_s"], 1e-9),
            "peak_gib": [base["peak_rss_gib"], other["peak_rss_gib"]]}
        print(f"seconds per step: {arms[0]} / {arm} = {ratio['step']:.2f}x; system time {ratio['system']:.1f}x; "
              f"peak resident {base['peak_rss_gib']:.1f} -> {other['peak_rss_gib']:.1f} GiB")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
