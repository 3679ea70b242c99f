"""Does the real pair fit? SmolLM2-135M-Instruct + Qwen2.5-Coder-0.5B-Instruct (examples/real/smollm2-qwen.yaml:
4 prompts x 8 samples, 48 new tokens, SGT) under `mutualrl run` and under `mutualrl up`, each in its own process
tree: the peak resident memory of the whole run (goal: <= 16 GiB for 10 steps), each process's peak (under `up`
a policy's learner and rollout service are processes of their own: its share), each policy's learner state
(weights, gradients, optimiser state) from the step records, and seconds per step.

Before #43 the same pair at 4 x 4 rows and 40 new tokens was killed by the OOM killer at 24.1 GB in step 2.

    .venv/bin/python benchmarks/bench_pair_memory.py [--steps 10] [--skip up] [--json out.json]
        [--set algorithm.micro_batch_rows=8 ...]   # any override of the example
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "real" / "smollm2-qwen.yaml"


def process_tree(pid: int) -> dict[int, tuple[int, str]]:
    """{pid: (resident bytes, command line)} of ``pid`` and its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = {}, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            rss = next(int(line.split()[1]) * 1024 for line in Path(f"/proc/{p}/status").read_text().splitlines()
                       if line.startswith("VmRSS:"))
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, StopIteration):
            continue
        out[p] = (rss, cmd)
    return out


def role(cmd: str) -> str:
    """A short name for a process of a run: `learner smollm2`, `rollout qwen-coder`, `redis`, `run`, ..."""
    words = cmd.split()
    for r in ("learner", "rollout"):
        if r in words and "--policy" in words:
            return f"{r} {words[words.index('--policy') + 1]}"
    if "redis-server" in cmd:
        return "redis"
    for w in ("run", "up", "observer", "tracker"):
        if w in words:
            return w
    return words[0].rsplit("/", 1)[-1] if words else "?"


def run_measured(cmd: list[str], log: Path) -> dict:
    """Run ``cmd`` to the end: the peak of the tree's summed RSS, each process's own peak, wall seconds."""
    peak = [0]
    per_role: dict[str, int] = {}
    with log.open("w") as f:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                tree = process_tree(proc.pid)
                peak[0] = max(peak[0], sum(r for r, _ in tree.values()))
                for rss, c in tree.values():
                    name = role(c)
                    per_role[name] = max(per_role.get(name, 0), rss)
                stop.wait(0.25)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        rc = proc.wait()
        stop.set()
        th.join()
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed (exit {rc}); log: {log}\n" + log.read_text()[-3000:])
    return {"peak_rss_gib": peak[0] / 2**30, "process_peak_gib": {k: v / 2**30 for k, v in sorted(per_role.items())},
            "wall_s": time.monotonic() - t0}


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
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="Keep the runs' folders here.")
    args = ap.parse_args()
    from mutualrl.config.loading import apply_overrides

    sets = [f"budget.steps={args.steps}", "eval.every=100000", *args.sets]
    figures: dict = {"config": str(args.config.relative_to(ROOT)), "steps": args.steps, "overrides": sets,
                     "threads": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        cfg_file = where / "cfg.yaml"
        cfg_file.write_text(yaml.safe_dump(apply_overrides(yaml.safe_load(args.config.read_text()), sets)))
        cli = [sys.executable, "-m", "mutualrl.app.cli"]
        for mode in ("run", "up"):
            if mode in args.skip:
                continue
            out = where / mode
            res = run_measured([*cli, mode, str(cfg_file), "--out", str(out)], where / f"{mode}.log")
            res.update(per_policy(out / "metrics.jsonl"))
            figures[mode] = res
            print(f"{mode}: {res['steps']} steps, peak {res['peak_rss_gib']:.1f} GiB, {res['step_s']} s/step; "
                  "processes " + ", ".join(f"{k} {v:.1f}" for k, v in res["process_peak_gib"].items()), flush=True)
            if args.json:
                args.json.write_text(json.dumps(figures, indent=2))
    missed = [m for m in ("run", "up") if m in figures and figures[m]["peak_rss_gib"] > 16.0]
    if missed:
        raise SystemExit(f"over 16 GiB: {', '.join(missed)}")


if __name__ == "__main__":
    main()
