"""What experiment tracking costs a run: the demo's RL step time with TensorBoard and MLflow on, over the same
run with only ``metrics.jsonl`` (docs/tracking.md). Goal: at most 2 % slower.

The MLflow side is a real ``mlflow server`` on loopback with a SQLite store (the one `make test` installs
into .venv-mlflow), without MLflow 3's job runner (tracking does not use it; it kept two cores busy for ~40 s
after start and ~2.5 % of a core afterwards). It runs at nice 19 by default, standing for a team's server on
other machines, and in this process's session: under the kernel's autogroup scheduling a new session is a CPU
group of its own, as strong as training's, and nice acts only inside a group (the invocations before
2026-11-27 started it so, and paid its whole ~0.25-0.4 ms of CPU per metric written to SQLite). At nice 0 it
takes that CPU from the cores training runs on. The trackers run as a run has them by default, in threads of
the training process; ``--variants off,on,process`` adds them in a child process at low priority
(``tracking.isolation: process``). Every run is in this invocation, interleaved, the order turned every repeat
(off, on, on, off, ...) so that neither a drift of the machine nor going first favours one; the runs are
identical (same seed, same prompts) but for the trackers. Step time: the summed ``step_s`` of the RL steps
(evaluations excluded, as they are the same in both); the trackers' one-time start (MLflow's experiment, runs
and ~200 parameters) is inside the first step, so it counts. The ratio is the mean over repeats of each
repeat's on/off pair, with a 95 % interval (Student's t): identical runs on a shared VM differ by several per
cent, so one pair says little.

    .venv/bin/python benchmarks/bench_tracking.py [--steps 80] [--repeats 5] [--variants off,on,process]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from mutualrl.app.embedded import run_embedded
from mutualrl.config import load_config
from mutualrl.runtime.compare_stats import ci95
from mutualrl.runtime.outputs import read_metrics

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from mlflow_server import MlflowServer, mlflow_binary  # noqa: E402  (tests/mlflow_server.py: a test fixture)

DEMO = ROOT / "examples" / "demo.yaml"
GOAL = 1.02


def rl_steps(out: Path) -> list[dict]:
    """A run's RL step records (every policy; the warm start's evaluation left out, as it is the same in both)."""
    return [r for r in read_metrics(out / "metrics.jsonl") if r.get("phase") != "warm_start" and "step_s" in r]


def step_window(rows: list[dict]) -> tuple[float, float]:
    """When the RL steps began and ended (wall clock): ``wall_time`` is stamped at a step's end."""
    return min(r["wall_time"] - r["step_s"] for r in rows), max(r["wall_time"] for r in rows)


class CpuSampler:
    """The server's CPU time, sampled in a thread every ``every_s``: what of it fell inside a run's RL
    steps is what it could take from training (its catching up after the last step costs the steps nothing)."""

    def __init__(self, server: MlflowServer, every_s: float = 0.5):
        self.server, self.every_s = server, every_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), self.server.cpu_seconds()))
            self._stop.wait(self.every_s)

    def between(self, t0: float, t1: float) -> float:
        """CPU seconds the server used from ``t0`` to ``t1`` (interpolated between samples)."""
        t, cpu = np.array(self.samples).T
        return float(np.interp(t1, t, cpu) - np.interp(t0, t, cpu))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def cpu_group(pid: int) -> str:
    """Whether the server shares this process's CPU group: with autogroup scheduling each session is a
    group of its own, and ``nice`` acts only inside a group (docs/tracking.md)."""
    try:
        mine, its = (Path(f"/proc/{p}/autogroup").read_text().split()[0] for p in ("self", pid))
    except OSError:
        return "no autogroup scheduling"
    return f"server in this process's CPU group ({its})" if mine == its else f"server in CPU group {its}, not {mine}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=80, help="RL steps per run (the demo's 80)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variants", default="off,on", help="comma-separated, from off, on, process (off and on needed)")
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
        print(f"MLflow server idle after {server.settle():.0f} s; {cpu_group(server.proc.pid)}", flush=True)
        uri = server.uri
        try:
            on = common + ["tracking.backends=[jsonl,tensorboard,mlflow]", f"tracking.mlflow.tracking_uri={uri}"]
            # "on": the trackers in threads of the training process (the default); "process": the same trackers in
            # a child process at nice 10
            known = {"off": common + ["tracking.backends=[jsonl]"], "on": on,
                     "process": on + ["tracking.isolation=process"]}
            names = [v.strip() for v in args.variants.split(",") if v.strip()]
            if not {"off", "on"} <= set(names) or not set(names) <= set(known):
                ap.error(f"--variants must name off and on, and only {', '.join(known)}")
            variants = {name: known[name] for name in names}
            run_embedded(load_config(DEMO, variants["off"] + ["budget.steps=1"]), tmp / "warm")  # caches warm starts
            times: dict[str, list[float]] = {name: [] for name in variants}
            taken: dict[str, list[float]] = {name: [] for name in variants}  # CPU trackers and server used
            capacity: list[float] = []  # the cores' seconds while each run's RL steps ran
            sampler = CpuSampler(server)
            for i in range(args.repeats):
                order = list(variants) if i % 2 == 0 else list(reversed(variants))  # off, on, then on, off
                for name in order:
                    sets = variants[name]
                    out = tmp / f"{name}-{i}"
                    summary = run_embedded(load_config(DEMO, sets), out)
                    rows = rl_steps(out)
                    times[name].append(sum(r["step_s"] for r in rows))
                    sent = summary.get("tracking") or {}
                    window = step_window(rows)
                    in_steps = sampler.between(*window)
                    capacity.append((window[1] - window[0]) * (os.cpu_count() or 1))
                    threads = sum(b["cpu_s"] for t in sent.values() for b in t.values())
                    taken[name].append(in_steps + threads)
                    print(f"{name} #{i}: RL steps {times[name][-1]:.2f} s; CPU of the server during them "
                          f"{in_steps:.2f} s, of the trackers' threads {threads:.2f} s; trackers {json.dumps(sent)}",
                          flush=True)
            sampler.stop()
            print(f"MLflow server CPU over the invocation: {server.cpu_seconds():.1f} s", flush=True)
        finally:
            server.stop()
    off = statistics.mean(times["off"])
    pairs = ci95([a / b for a, b in zip(times["on"], times["off"])])
    ratio, half = float(pairs["mean"]), float(pairs["ci95"] or 0.0)
    others = "".join(f"; {name}: {ci95([a / b for a, b in zip(times[name], times['off'])])['mean']:.3f}"
                     for name in variants if name not in ("off", "on"))
    extra = statistics.mean(taken["on"]) - statistics.mean(taken["off"])
    cores = statistics.mean(capacity)
    print(f"\nCPU the trackers' threads and the server used while the RL steps ran, on over off: {extra:.2f} s a "
          f"run, of the cores' {cores:.0f} s ({100 * extra / cores:.1f} %)")
    print(f"demo, {args.steps} steps x {args.repeats} repeats, MLflow server at nice {args.server_nice}: "
          f"step time without trackers {off:.2f} s, with tensorboard+mlflow {statistics.mean(times['on']):.2f} s: "
          f"ratio {ratio:.3f} ± {half:.3f} (goal <= {GOAL}) -> {'ok' if ratio <= GOAL else 'MISSED'}{others}")
    return 0 if ratio <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
