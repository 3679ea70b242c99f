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

With ``--device cuda`` nothing is paced: the hf engine and the learner of every policy run on the GPU and the
costs are the real ones, on models large enough to load it (GPU_MODELS: a 12-layer, 768-wide policy; in part 2
the fast policy is a 3-layer, 256-wide one, and the ratio of their costs is measured, not set). Every service
of the run shares the one GPU, as on a single-GPU workstation.

    .venv/bin/python benchmarks/bench_async.py [--steps 10] [--stage-s 2.0] [--only pipeline|peers]
    python benchmarks/bench_async.py --device cuda [--steps 12] [--prompts 32]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from mutualrl.app.launcher import run_services
from mutualrl.config import load_config
from mutualrl.runtime.outputs import read_metrics
from mutualrl.runtime.pacing import PACE_ENV

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo.yaml"
FAST, SLOW = "llama-char", "qwen-bpe"  # the demo's two policies

# --device: the policies' shapes on a GPU (and a warm start short enough for one device lease)
LARGE = {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "intermediate_size": 3072}
SMALL = {"hidden_size": 256, "num_layers": 3, "num_heads": 4, "intermediate_size": 1024}
WARM = {"max_steps": 1500, "check_every": 100, "lr": 5.0e-4}


def gpu_sets(device: str, shapes: dict[str, dict]) -> list[str]:
    """Overrides that put every policy's engine and learner on ``device`` with the given model shapes."""
    sets = []
    for policy, shape in shapes.items():
        sets.append(f"policies.{policy}.engine.device={device}")
        sets += [f"policies.{policy}.model.{k}={v}" for k, v in shape.items()]
        sets += [f"policies.{policy}.warm_start.{k}={v}" for k, v in WARM.items()]
    return sets


def step_records(metrics: Path) -> list[dict]:
    """The RL steps' records of a run (warm start and records without a wall time left out)."""
    return [r for r in read_metrics(metrics) if r.get("phase") != "warm_start" and "wall_time" in r]


def stage_means(metrics: Path) -> dict[str, dict[str, float]]:
    """Each policy's mean seconds per stage (generation and the learner's stages) over its steps."""
    sums: dict[str, dict[str, list[float]]] = {}
    for r in step_records(metrics):
        stages = dict(r.get("stage_seconds") or {})
        if r.get("gen_s") is not None:
            stages["generate"] = r["gen_s"]
        for k, v in stages.items():
            sums.setdefault(r["policy"], {}).setdefault(k, []).append(float(v))
    return {p: {k: sum(v) / len(v) for k, v in st.items()} for p, st in sums.items()}


def policy_rates(metrics: Path) -> dict[str, float]:
    """Each policy's steps/s between its second and its last-but-one step."""
    times: dict[str, dict[int, float]] = {}
    for r in step_records(metrics):
        times.setdefault(r["policy"], {})[r["step"]] = r["wall_time"]
    rates = {}
    for policy, by_step in times.items():
        steps = sorted(by_step)[1:-1]
        rates[policy] = (len(steps) - 1) / (by_step[steps[-1]] - by_step[steps[0]])
    return rates


def peer_lags(metrics: Path, policy: str) -> list[int]:
    """The largest step lag of the peer experience each of ``policy``'s steps admitted."""
    return [r["peer_step_lag_max"] for r in read_metrics(metrics)
            if r.get("policy") == policy and r.get("peer_step_lag_max") is not None]


def run(out: Path, sets: list[str], pace: dict[str, float], solo: bool = False) -> Path:
    """One `mutualrl up` run of the demo with ``sets`` and each ``policy/stage`` paced; its metrics file."""
    cfg = load_config(DEMO, sets)
    if solo:  # the fast policy alone: its rate with nobody to wait for
        cfg = load_config(DEMO, sets + ["sharing.mode=none"])
        cfg.policies = cfg.policies[:1]
    if pace:
        os.environ[PACE_ENV] = ",".join(f"{k}={v}" for k, v in pace.items())
    try:
        rc, _ = run_services(cfg, out, echo=lambda line: None)
    finally:
        os.environ.pop(PACE_ENV, None)
    if rc != 0:
        raise SystemExit(f"mutualrl up failed with {rc}; logs are in {out / 'logs'}")
    return out / "metrics.jsonl"


def pipeline(tmp: Path, base: list[str], stage_s: float, device: str | None = None) -> None:
    """Generation and training of equal length (paced), or the real costs on ``device``: k = 0, 1, 2."""
    pace = {} if device else {f"{p}/{stage}": stage_s for p in (FAST, SLOW) for stage in ("generate", "train")}
    sets = gpu_sets(device, {FAST: LARGE, SLOW: LARGE}) if device else []
    rates, stages = {}, {}
    for k in (0, 1, 2):
        m = run(tmp / f"k{k}", base + sets + [f"async.max_staleness={k}"], pace)
        rates[k] = min(policy_rates(m).values())  # a step of the run ends when its slower policy ends
        stages[k] = stage_means(m)
    if device:
        print(f"\n1. pipelining on {device}, unpaced, both policies {LARGE['num_layers']} layers x "
              f"{LARGE['hidden_size']}, lockstep peers")
        print_stages(stages)
    else:
        print(f"\n1. pipelining, generate = train = {stage_s:.1f} s per step, both policies, lockstep peers")
    print("| async.max_staleness | steps/s | vs synchronous |\n| --- | --- | --- |")
    for k, r in rates.items():
        print(f"| {k} | {r:.3f} | {r / rates[0]:.2f}× |")
    print(f"k = 1: {rates[1] / rates[0]:.2f}× the synchronous run (goal ≥ 1.8×, limit 2×)")


def print_stages(stages: dict) -> None:
    """Mean seconds of each stage per step, per run and policy (what the overlap has to hide)."""
    names = sorted({s for by_policy in stages.values() for st in by_policy.values() for s in st})
    print("| run | policy | " + " | ".join(f"{n} s" for n in names) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in names) + " |")
    for run_name, by_policy in stages.items():
        for policy, st in sorted(by_policy.items()):
            print(f"| {run_name} | {policy} | " + " | ".join(f"{st.get(n, float('nan')):.3f}" for n in names) + " |")


def peers(tmp: Path, base: list[str], stage_s: float, device: str | None = None) -> None:
    """A fast and a slow policy (1 : 4 paced, or a small and a large model on ``device``): the fast one's rate
    alone, under lockstep and under bounded."""
    fast_s = stage_s / 4
    pace = {} if device else {f"{FAST}/generate": fast_s, f"{FAST}/train": fast_s,
                              f"{SLOW}/generate": stage_s, f"{SLOW}/train": stage_s}
    base = base + (gpu_sets(device, {FAST: SMALL, SLOW: LARGE}) if device else [])
    alone_m = run(tmp / "alone", base, pace, solo=True)
    alone = policy_rates(alone_m)[FAST]
    lock = policy_rates(run(tmp / "lockstep", base + ["async.peers=lockstep"], pace))[FAST]
    bounded_m = run(tmp / "bounded", base + ["async.peers=bounded"], pace)
    bounded = policy_rates(bounded_m)
    lags = peer_lags(bounded_m, FAST) + peer_lags(bounded_m, SLOW)
    bound = load_config(DEMO, base).sharing.max_version_lag
    if device:
        work = {p: sum(v for k, v in st.items() if k != "wait") for p, st in stage_means(bounded_m).items()}
        print(f"\n2. no lockstep on {device}, unpaced: {FAST} {SMALL['num_layers']} layers x "
              f"{SMALL['hidden_size']}, {SLOW} {LARGE['num_layers']} layers x {LARGE['hidden_size']}; their "
              f"stages (waiting left out) take {work[FAST]:.2f} and {work[SLOW]:.2f} s a step under bounded "
              f"(1 : {work[SLOW] / work[FAST]:.1f})")
        print_stages({"alone": stage_means(alone_m), "bounded": stage_means(bounded_m)})
    else:
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
    ap.add_argument("--device", help="Unpaced, every policy's engine and learner on this torch device (e.g. cuda).")
    ap.add_argument("--prompts", type=int, default=4, help="Prompts per step (x the demo's group of 8 rollouts).")
    ap.add_argument("--keep", type=Path, help="Keep every run (metrics, logs) under this folder (default: a "
                                               "temporary one, removed at the end).")
    args = ap.parse_args()
    base = [f"budget.steps={args.steps}", f"budget.prompts_per_step={args.prompts}", "eval.every=1000",
            "eval.size=8", "sharing.mode=sgt", "launcher.peer_deadline_s=120", "checkpoint.every=1000"]
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        if args.only in (None, "pipeline"):
            pipeline(where, base, args.stage_s, args.device)
        if args.only in (None, "peers"):
            peers(where, base, args.stage_s, args.device)


if __name__ == "__main__":
    main()
