"""What asynchronous training buys in throughput, on the real services (`mutualrl up`: every service its own
process, a real Redis, gRPC), with paced stages: generation and training take fixed seconds per step
(MUTUALRL_PACE, mutualrl.runtime.pacing), so the schedule is measured and not the 2 CPU cores.

1. Pipelining within a policy (generation ≈ training): steps/s at ``async.max_staleness`` k = 1 and 2 over
   the synchronous run (k = 0). Goal: k = 1 ≥ 1.8× (the limit is 2×).
2. No lockstep between policies whose steps cost 1 : 4: the fast policy's steps/s under ``async.peers``
   lockstep and bounded over its rate alone (the same policy, no peer). Goal: bounded ≥ 0.9×, and no peer
   experience older than ``sharing.max_version_lag`` used.

Every run is in this invocation; steps/s is measured from the second step's record to the last but one
(start-up and the final evaluation left out).

    .venv/bin/python benchmarks/bench_async.py [--steps 10] [--stage-s 2.0] [--only pipeline|peers]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from mutualrl.app.launcher import run_services
from mutualrl.config import load_config
from mutualrl.runtime.pacing import PACE_ENV

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo.yaml"
FAST, SLOW = "llama-char", "qwen-bpe"  # the demo's two policies


def policy_rates(metrics: Path) -> dict[str, float]:
    """Each policy's steps/s between its second and its last-but-one step."""
    times: dict[str, dict[int, float]] = {}
    for line in metrics.read_text().splitlines():
        r = json.loads(line)
        if r.get("phase") != "warm_start" and "wall_time" in r:
            times.setdefault(r["policy"], {})[r["step"]] = r["wall_time"]
    rates = {}
    for policy, by_step in times.items():
        steps = sorted(by_step)[1:-1]
        rates[policy] = (len(steps) - 1) / (by_step[steps[-1]] - by_step[steps[0]])
    return rates


def peer_lags(metrics: Path, policy: str) -> list[int]:
    """The largest step lag of the peer experience each of ``policy``'s steps admitted."""
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [r["peer_step_lag_max"] for r in recs
            if r.get("policy") == policy and r.get("peer_step_lag_max") is not None]


def run(out: Path, sets: list[str], pace: dict[str, float], solo: bool = False) -> Path:
    """One `mutualrl up` run of the demo with ``sets`` and each ``policy/stage`` paced; its metrics file."""
    cfg = load_config(DEMO, sets)
    if solo:  # the fast policy alone: its rate with nobody to wait for
        cfg = load_config(DEMO, sets + ["sharing.mode=none"])
        cfg.policies = cfg.policies[:1]
    os.environ[PACE_ENV] = ",".join(f"{k}={v}" for k, v in pace.items())
    try:
        rc, _ = run_services(cfg, out, echo=lambda line: None)
    finally:
        os.environ.pop(PACE_ENV, None)
    if rc != 0:
        raise SystemExit(f"mutualrl up failed with {rc}; logs are in {out / 'logs'}")
    return out / "metrics.jsonl"


def pipeline(tmp: Path, base: list[str], stage_s: float) -> None:
    """Generation and training of equal length: k = 0, 1, 2."""
    pace = {f"{p}/{stage}": stage_s for p in (FAST, SLOW) for stage in ("generate", "train")}
    rates = {}
    for k in (0, 1, 2):
        m = run(tmp / f"k{k}", base + [f"async.max_staleness={k}"], pace)
        rates[k] = min(policy_rates(m).values())  # a step of the run ends when its slower policy ends
    print(f"\n1. pipelining, generate = train = {stage_s:.1f} s per step, both policies, lockstep peers")
    print("| async.max_staleness | steps/s | vs synchronous |\n| --- | --- | --- |")
    for k, r in rates.items():
        print(f"| {k} | {r:.3f} | {r / rates[0]:.2f}× |")
    print(f"k = 1: {rates[1] / rates[0]:.2f}× the synchronous run (goal ≥ 1.8×, limit 2×)")


def peers(tmp: Path, base: list[str], stage_s: float) -> None:
    """A fast and a slow policy (1 : 4): the fast one's rate alone, under lockstep and under bounded."""
    fast_s = stage_s / 4
    pace = {f"{FAST}/generate": fast_s, f"{FAST}/train": fast_s, f"{SLOW}/generate": stage_s, f"{SLOW}/train": stage_s}
    alone = policy_rates(run(tmp / "alone", base, pace, solo=True))[FAST]
    lock = policy_rates(run(tmp / "lockstep", base + ["async.peers=lockstep"], pace))[FAST]
    bounded_m = run(tmp / "bounded", base + ["async.peers=bounded"], pace)
    bounded = policy_rates(bounded_m)
    lags = peer_lags(bounded_m, FAST) + peer_lags(bounded_m, SLOW)
    bound = load_config(DEMO, base).sharing.max_version_lag
    print(f"\n2. no lockstep: {FAST} generates and trains {fast_s:.2f} + {fast_s:.2f} s a step, {SLOW} "
          f"{stage_s:.1f} + {stage_s:.1f} s (1 : 4)")
    print(f"| {FAST} | steps/s | vs alone |\n| --- | --- | --- |")
    print(f"| alone | {alone:.3f} | 1.00× |")
    print(f"| lockstep | {lock:.3f} | {lock / alone:.2f}× |")
    print(f"| bounded | {bounded[FAST]:.3f} | {bounded[FAST] / alone:.2f}× |")
    print(f"bounded: {FAST} at {bounded[FAST] / alone:.2f}× its rate alone (goal ≥ 0.9×); {SLOW} at "
          f"{bounded[SLOW]:.3f} steps/s; largest peer step lag used {max(lags, default=0)} "
          f"(bound {bound}: {'held' if max(lags, default=0) <= bound else 'BROKEN'})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--stage-s", type=float, default=2.0, help="Seconds of a paced stage (the slow policy's).")
    ap.add_argument("--only", choices=["pipeline", "peers"])
    args = ap.parse_args()
    base = [f"budget.steps={args.steps}", "budget.prompts_per_step=4", "eval.every=1000", "eval.size=8",
            "sharing.mode=sgt", "launcher.peer_deadline_s=120", "checkpoint.every=1000"]
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "pipeline"):
            pipeline(Path(tmp), base, args.stage_s)
        if args.only in (None, "peers"):
            peers(Path(tmp), base, args.stage_s)


if __name__ == "__main__":
    main()
