"""A policy's trackers in a child process at low CPU priority (``tracking.isolation: process``).

The training process only writes each ``metrics.jsonl`` record, as one JSON line, into a pipe from a thread of
its own; the child (``python -m mutualrl.tracking.child``, at nice :data:`NICE`) turns records into points, runs
the guarded backends of :mod:`mutualrl.tracking.tracker`, and tells the parent, as JSON lines, what it warned
about, dropped and sent. A tracker library that hangs, leaks memory, holds the GIL or crashes the interpreter
is then cut off from training. It is not the default: on the 2-core development machine it measured no faster
than threads (the clients' own CPU is ~0.3 s a run; what a co-located MLflow server costs is the server's),
and each policy pays one more Python process that imports torch for TensorBoard (docs/tracking.md).

The guarantees do not change: ``log`` never blocks or raises; past ``max_pending`` records waiting for the
pipe, records are dropped and counted; a child that fails to start or dies is warned about once and its
points counted as dropped; ``finish`` waits at most ``timeout_s`` (plus the child's start-up, if it has not
started yet) and then kills it.

Wire (one JSON object per line). Parent → child: ``{"start": {"config", "info"}}`` first, then
``{"log": record}`` per record and ``{"finish": summary}`` last. Child → parent: ``{"ready": [backends]}``,
``{"warn": [backend, message]}``, ``{"drop": [backend, n]}`` and ``{"done": {backend: stats}}``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import asdict
from typing import Callable

from mutualrl.config.tracking import TrackingConfig
from mutualrl.tracking.backend import RunInfo

NICE = 10  # the child's CPU priority: it yields the cores to training, and still gets idle time on them
FINISH_MARGIN_S = 10.0  # beyond timeout_s: the child closes each tracker's thread (~1 s) and reports
START_GRACE_S = 60.0  # how long finish waits, beyond timeout_s, for a child still importing its libraries
PROCESS = "process"  # the pseudo-backend a failure of the child itself is warned about under


class ProcessTracker:
    """The parent side: the same calls as :class:`mutualrl.tracking.tracker.Tracker`."""

    def __init__(self, cfg: TrackingConfig, info: RunInfo, names: list[str], warn: Callable[[str, str], None],
                 drop_callback: Callable[[str], Callable[[int], None]]):
        self._names = names
        self.timeout_s = cfg.timeout_s
        self.max_pending = cfg.max_pending
        self._warn = warn
        self._on_drop = {n: drop_callback(n) for n in names}
        self._dropped = {n: 0 for n in names}  # on the way to the child
        self._child_dropped = {n: 0 for n in names}  # by the child's guards (its stats count them too)
        self._lines: deque[bytes] = deque()
        self._cond = threading.Condition()
        self._closed = False  # finish was called: nothing more is queued
        self._dead = False  # the child cannot take more lines
        self._ready = threading.Event()
        self._done = threading.Event()
        self._stats: dict[str, dict] = {}
        start = {"start": {"config": cfg.model_dump(mode="json"), "info": _info_json(info)}}
        self._lines.append(_line(start))
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "mutualrl.tracking.child"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        except OSError as e:
            self.proc = None
            self._fail(f"tracking: the tracker process did not start ({e}); this run logs to metrics.jsonl only")
            return
        try:
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, NICE)
        except OSError:  # it exited already (the reader says why) or a platform without priorities
            pass
        self._reader = threading.Thread(target=self._read, name="tracking-events", daemon=True)
        threading.Thread(target=self._write, name="tracking-pipe", daemon=True).start()
        self._reader.start()

    def names(self) -> list[str]:
        """The trackers the child runs (as :meth:`Tracker.names`)."""
        return list(self._names)

    # ---- what training calls --------------------------------------------------------------------
    def log(self, record: dict) -> None:
        """Queue one ``metrics.jsonl`` record for the child. Never blocks or raises."""
        if "step" not in record:
            return
        with self._cond:
            if self._closed:
                return
            if self._dead or len(self._lines) >= self.max_pending:
                self._drop_all(1, "the tracker process is behind" if not self._dead else "")
                return
            self._lines.append(_line({"log": record}))
            self._cond.notify()

    def finish(self, summary: dict) -> dict:
        """Send the final numbers, let the child close its trackers; per backend, what it sent and dropped."""
        with self._cond:
            if not self._closed and not self._dead:
                self._lines.append(_line({"finish": summary}))
            self._closed = True
            self._cond.notify()
        if self.proc is not None:
            t0 = time.monotonic()
            while not self._done.wait(timeout=0.2):
                waited = time.monotonic() - t0
                if self.proc.poll() is not None and not self._reader.is_alive():
                    break
                if waited > self.timeout_s + FINISH_MARGIN_S and (self._ready.is_set()
                                                                   or waited > self.timeout_s + START_GRACE_S):
                    self._warn(PROCESS, f"tracking: the tracker process did not finish in {waited:.0f} s; "
                                         "stopped, its unsent points dropped")
                    break
            try:  # a child that said it is done exits at once; any other is stopped now
                self.proc.wait(timeout=5 if self._done.is_set() else 0.01)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with self._cond:
            left = self._count_pending()
            self._lines.clear()
        if left and not self._done.is_set():
            self._drop_all(left, "")
        out = {}
        for n in self._names:
            s = dict(self._stats.get(n, {"sent": 0, "dropped": self._child_dropped[n], "errors": 0, "cpu_s": 0.0}))
            s["dropped"] = s.get("dropped", 0) + self._dropped[n]
            out[n] = s
        return out

    def dropped(self) -> int:
        """Points dropped so far, over every backend."""
        return sum(self._dropped.values()) + sum(self._child_dropped.values())

    # ---- the two threads and their bookkeeping --------------------------------------------------------
    def _count_pending(self) -> int:
        return sum(1 for line in self._lines if line.startswith(b'{"log"'))

    def _drop_all(self, n: int, why: str) -> None:
        """``n`` records lost on the way to the child: a point per backend each."""
        for name in self._names:
            self._dropped[name] += n
            self._on_drop[name](n)
        if why:
            self._warn(PROCESS, f"tracking: {why} ({self.max_pending} records wait); dropping points, training "
                                 "goes on and metrics.jsonl is complete")

    def _fail(self, message: str) -> None:
        with self._cond:
            self._dead = True
            lost = self._count_pending()
            self._lines.clear()
            self._cond.notify_all()
        self._warn(PROCESS, message)
        if lost:
            self._drop_all(lost, "")

    def _write(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        while True:
            with self._cond:
                while not self._lines and not self._closed and not self._dead:
                    self._cond.wait()
                if self._dead or (not self._lines and self._closed):
                    break
                line = self._lines[0]
            try:
                self.proc.stdin.write(line)  # blocks on a full pipe, without the GIL: training is not held
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                break  # the child is gone: the reader says why and counts what was lost
            with self._cond:
                if self._lines and self._lines[0] is line:
                    self._lines.popleft()
        try:
            self.proc.stdin.close()  # end of input: the child finishes whatever it has
        except (BrokenPipeError, OSError, ValueError):
            pass

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue  # not ours (the child's stdout is its protocol only; see _child_protocol)
            if "ready" in event:
                self._ready.set()
            elif "warn" in event:
                self._warn(*event["warn"])
            elif "drop" in event:
                backend, n = event["drop"]
                if backend in self._on_drop:
                    self._child_dropped[backend] += int(n)
                    self._on_drop[backend](int(n))
            elif "done" in event:
                self._stats = event["done"]
                self._done.set()
        code = self.proc.wait()
        if not self._done.is_set():
            self._fail(f"tracking: the tracker process exited with code {code} before the run ended; this run "
                       "goes on with metrics.jsonl only, its tracker points are counted as dropped")


def _line(obj: dict) -> bytes:
    return (json.dumps(obj, default=str, allow_nan=True) + "\n").encode()


def _info_json(info: RunInfo) -> dict:
    d = asdict(info)
    d["run_dir"] = str(info.run_dir)
    return d
