"""A command's memory as the benchmarks measure it: the peak of its process tree's summed resident memory, each
process's own peak by role (a service of `mutualrl up`, Redis, the launcher), and its wall time (from /proc)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path


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
    """Run ``cmd`` to the end: the peak of the tree's summed RSS (``peak_rss_gib``), each process's own peak by role
    (``process_peak_gib``), wall seconds. Exits naming the log when the command fails."""
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
