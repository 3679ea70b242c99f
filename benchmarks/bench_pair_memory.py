"""Does the real pair fit? SmolLM2-135M-Instruct + Qwen2.5-Coder-0.5B-Instruct (examples/real/smollm2-qwen.yaml:
4 prompts x 8 samples, 48 new tokens, SGT) under `mutualrl run` and under `mutualrl up`, each in its own process
tree: the peak resident memory of the whole run (goal: <= 16 GiB for 10 steps), each process's peak (under `up`
a policy's learner and rollout service are processes of their own: its share), each policy's learner state
(weights, gradients, optimiser state) from the step records, and seconds per step.

Before #43 the same pair at 4 x 4 rows and 40 new tokens was killed by the OOM killer at 24.1 GB in step 2.

    .venv/bin/python benchmarks/bench_pair_memory.py [--steps 10] [--skip up] [--json out.json]
        [--set algorithm.micro_batch_rows=8 ...]   # any override of the example

On a lent device's host (benchmarks/gpu/run_all.py's ``pair_memory_bf16``), where the real weights and
reasoning-gym do not travel: ``--random-weights smollm2=DIR --random-weights qwen-coder=DIR --task arithmetic``
gives each policy a random-weight network of DIR's config with DIR's tokenizer, and our built-in sums. Memory
does not depend on the weights' values; random weights never end a row early, so every completion is the full
``max_new_tokens`` (the most memory a step can take).
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
from process_memory import run_measured  # noqa: E402

CONFIG = ROOT / "examples" / "real" / "smollm2-qwen.yaml"


def per_policy(metrics: Path) -> dict:
    """Seconds per step (between the ends of the first and the last step, both policies done) and each
    policy's learner state and mean seconds of its own step (generate + train), from the run's step records."""
    recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    steps = [r for r in recs if "policy" in r and r.get("step", 0) >= 1 and "step_s" in r]
    ends: dict[int, float] = {}
    out: dict[str, dict] = {}
    for r in steps:
        ends[r["step"]] = max(ends.get(r["step"], 0.0), r.get("wall_time", 0.0))
        o = out.setdefault(r["policy"], {"steps": 0, "step_s": 0.0, "state_gib": None, "reward": []})
        o["steps"] += 1
        o["step_s"] += r["step_s"]
        o["reward"].append(r.get("reward_mean"))
        if r.get("learner_state_bytes"):
            o["state_gib"] = r["learner_state_bytes"] / 2**30
    for o in out.values():
        o["step_s"] /= max(1, o["steps"])
    t = [ends[k] for k in sorted(ends)]
    return {"steps": len(t), "step_s": (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None, "policies": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--skip", action="append", default=[], choices=["run", "up"])
    ap.add_argument("--set", action="append", default=[], dest="sets", help="An override of the config (KEY=VALUE).")
    ap.add_argument("--random-weights", action="append", default=[], metavar="POLICY=DIR",
                    help="This policy's model: DIR's config and tokenizer with weights initialised at seed 0.")
    ap.add_argument("--task", choices=["config", "arithmetic"], default="config",
                    help="arithmetic: our built-in 1-2 digit sums instead of the config's task.")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="Keep the runs' folders here.")
    args = ap.parse_args()
    from bench_vs_trl import ARITHMETIC_TASK, random_weights_dir

    from mutualrl.config.loading import apply_overrides

    sets = [f"budget.steps={args.steps}", "eval.every=100000", *args.sets]
    figures: dict = {"config": str(args.config.resolve().relative_to(ROOT)), "steps": args.steps, "overrides": sets,
                     "threads": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        for spec in args.random_weights:
            policy, _, folder = spec.partition("=")
            made = random_weights_dir(Path(folder), where / "models" / policy)
            sets.append(f"policies.{policy}.model.path={made}")
        raw = yaml.safe_load(args.config.read_text())
        if args.task == "arithmetic":
            raw["task"] = dict(ARITHMETIC_TASK)
        cfg_file = where / "cfg.yaml"
        cfg_file.write_text(yaml.safe_dump(apply_overrides(raw, sets)))
        cli = [sys.executable, "-m", "mutualrl.app.cli"]
        for mode in ("run", "up"):
            if mode in args.skip:
                continue
            out = where / mode
            res = run_measured([*cli, mode, str(cfg_file), "--out", str(out)], where / f"{mode}.log")
            res.update(per_policy(out / "metrics.jsonl"))
            res.pop("timeline")  # a sample every 0.25 s: the peaks above are its figures
            figures[mode] = res
            print(f"{mode}: {res['steps']} steps, peak {res['peak_rss_gib']:.1f} GiB resident, "
                  f"{res['peak_anon_gib']:.1f} GiB anonymous + shared, {res['step_s']} s/step; processes (resident / "
                  "anonymous) " + ", ".join(f"{k} {v:.1f}/{res['process_peak_anon_gib'][k]:.1f}"
                                            for k, v in res["process_peak_gib"].items()), flush=True)
            if args.json:
                args.json.write_text(json.dumps(figures, indent=2))
    missed = [m for m in ("run", "up") if m in figures and figures[m]["peak_rss_gib"] > 16.0]
    if missed:
        raise SystemExit(f"over 16 GiB: {', '.join(missed)}")


if __name__ == "__main__":
    main()
