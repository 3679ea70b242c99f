"""A command's memory as the benchmarks measure it: the peak of its process tree's summed resident memory, each
process's own peak by role (a service of `mutualrl up`, Redis, the launcher), and its wall time (from /proc).

Two measures of resident memory: ``rss`` (VmRSS: everything mapped and in RAM, including pages of files a process
maps — a weights file it reads through mmap — which the kernel can drop and read again) and ``anon`` (RssAnon +
RssShmem: what the kernel cannot drop without swap; tensors a process allocated, shared-memory weight slots). A
run is killed for memory by the second."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path


def proc_stats() -> dict[int, list[str]]:
    """Every process's /proc/PID/stat fields after its command name (field 3 on: state, ppid, …, utime at [11],
    stime at [12])."""
    out: dict[int, list[str]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out[int(d.name)] = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
    return out


def descendants(pid: int, stats: dict[int, list[str]] | None = None) -> list[int]:
    """``pid`` and every process below it (from :func:`proc_stats`' parent ids)."""
    children: dict[int, list[int]] = {}
    for p, fields in (stats if stats is not None else proc_stats()).items():
        try:
            children.setdefault(int(fields[1]), []).append(p)
        except (IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def cmdline(pid: int) -> str:
    """A process's command line as one string ("" once it has exited: a zombie has none). Raises OSError when the
    process is gone."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()


def process_tree(pid: int) -> dict[int, tuple[int, int, str]]:
    """{pid: (resident bytes, anonymous + shared-memory resident bytes, command line)} of ``pid`` and its descendants
    (from /proc)."""
    out = {}
    for p in descendants(pid):
        try:
            status = {line.split(":")[0]: int(line.split()[1]) * 1024
                      for line in Path(f"/proc/{p}/status").read_text().splitlines()
                      if line.startswith(("VmRSS:", "RssAnon:", "RssShmem:"))}
            cmd = cmdline(p)
        except OSError:
            continue
        if "VmRSS" in status:
            out[p] = (status["VmRSS"], status.get("RssAnon", 0) + status.get("RssShmem", 0), cmd)
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


def host_memory() -> dict:
    """The host's available memory (GiB) and its major page faults so far: a run measured while the host is short
    of memory re-reads evicted file pages (its libraries, a model's mapped weights) from disk, and runs slower for
    it, which is no property of the code."""
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    vmstat = dict(line.split() for line in Path("/proc/vmstat").read_text().splitlines())
    return {"available_gib": int(meminfo["MemAvailable"].split()[0]) / 2**20, "major_faults": int(vmstat["pgmajfault"])}


def run_measured(cmd: list[str], log: Path) -> dict:
    """Run ``cmd`` to the end: the peak of the tree's summed RSS (``peak_rss_gib``) and of its summed anonymous and
    shared memory (``peak_anon_gib``), each process's own peaks by role (``process_peak_gib``,
    ``process_peak_anon_gib``), wall seconds, and the samples themselves (``timeline``: [epoch seconds, RSS GiB,
    anon GiB] every 0.25 s, to line up with a run's step end times: which phase sets the peak), the host's available
    memory at the start and its major page faults while the command ran (``host``), and the CPU seconds and minor
    page faults of the command and the children it waited for (``cpu``). Exits naming the log when the command
    fails."""
    peak = [0, 0]
    timeline: list[list[float]] = []
    per_role: dict[str, int] = {}
    per_role_anon: dict[str, int] = {}
    before = host_memory()
    with log.open("w") as f:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                tree = process_tree(proc.pid)
                rss, anon = sum(r for r, _, _ in tree.values()), sum(a for _, a, _ in tree.values())
                peak[0], peak[1] = max(peak[0], rss), max(peak[1], anon)
                timeline.append([round(time.time(), 2), round(rss / 2**30, 3), round(anon / 2**30, 3)])
                for own_rss, own_anon, c in tree.values():
                    name = role(c)
                    per_role[name] = max(per_role.get(name, 0), own_rss)
                    per_role_anon[name] = max(per_role_anon.get(name, 0), own_anon)
                stop.wait(0.25)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        _, status, usage = os.wait4(proc.pid, 0)  # the CPU time and page faults too (of the tree it waited for)
        rc = proc.returncode = os.waitstatus_to_exitcode(status)
        stop.set()
        th.join()
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed (exit {rc}); log: {log}\n" + log.read_text()[-3000:])
    return {"peak_rss_gib": peak[0] / 2**30, "peak_anon_gib": peak[1] / 2**30,
            "process_peak_gib": {k: v / 2**30 for k, v in sorted(per_role.items())},
            "process_peak_anon_gib": {k: v / 2**30 for k, v in sorted(per_role_anon.items())},
            "wall_s": time.monotonic() - t0, "timeline": timeline,
            "cpu": {"user_s": usage.ru_utime, "system_s": usage.ru_stime, "minor_faults": usage.ru_minflt},
            "host": {"available_gib_at_start": round(before["available_gib"], 2),
                     "major_faults": host_memory()["major_faults"] - before["major_faults"]}}
