"""Where a command's CPU time goes, process by process, over time: which service of `mutualrl up` holds the cores
while another one works (on 2 cores, one busy neighbour is enough to halve a phase).

Samples every process of the command's tree from /proc every ``--every`` seconds: its CPU time (user + system) and
its role (`learner smollm2`, `rollout smollm2`, `redis`, `up`, ...; process_memory.role). Prints each role's CPU
seconds and, per interval, each role's share of a core; ``--json`` keeps the timeline.

    .venv/bin/python benchmarks/cpu_timeline.py --json /tmp/up-cpu.json -- .venv/bin/mutualrl up CONFIG --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_memory import cmdline, descendants, proc_stats, role  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system, children that were waited for excluded) of ``pid`` and its descendants, summed by
    role."""
    stats = proc_stats()
    out: dict[str, float] = {}
    for p in descendants(pid, stats):
        try:
            cmd = cmdline(p)
        except OSError:
            continue
        if p not in stats or not cmd:
            continue  # gone, or exited (a zombie): its time was counted while it ran
        name = role(cmd)
        out[name] = out.get(name, 0.0) + (int(stats[p][11]) + int(stats[p][12])) / TICK  # utime, stime
    return out


def main() -> None:
    """Run the command, sample its tree's CPU time, print per-role totals and the timeline."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=float, default=1.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    t0 = time.monotonic()
    last: dict[str, float] = {}
    peak: dict[str, float] = {}  # a role's CPU seconds never go down, though its processes come and go
    timeline: list[dict] = []
    while proc.poll() is None:
        time.sleep(args.every)
        now = tree_cpu(proc.pid)
        for k, v in now.items():
            peak[k] = max(peak.get(k, 0.0), v)
        t = time.monotonic() - t0
        share = {k: round((v - last.get(k, 0.0)) / args.every, 2) for k, v in now.items() if v - last.get(k, 0.0) > 0}
        last = {**last, **now}
        timeline.append({"t": round(t, 1), "cores": share})
    wall = time.monotonic() - t0
    print(f"exit {proc.returncode}, {wall:.0f} s wall; CPU seconds by role:")
    for k, v in sorted(peak.items(), key=lambda kv: -kv[1]):
        print(f"  {k:24s} {v:8.1f} s  ({v / wall:.2f} cores on average)")
    if args.json:
        args.json.write_text(json.dumps({"cmd": cmd, "wall_s": wall, "cpu_s": peak, "timeline": timeline}) + "\n")
    raise SystemExit(proc.returncode)


if __name__ == "__main__":
    main()
