"""A tracker never hurts a run: each backend runs in its own thread behind a bounded buffer.

Training only appends to the buffer (no I/O on the step's path). A backend that raises is warned about
once, and the call is retried with a growing pause while newer points wait; past ``max_pending`` waiting
points, new ones are dropped and counted. At the end of the run the buffer gets ``timeout_s`` to drain;
what is left is dropped and counted too. ``metrics.jsonl`` is written by the learner itself, so it is
complete whatever a tracker does.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from mutualrl.tracking.backend import Backend

RETRIES = 3  # attempts of one call before its points are dropped
PAUSE_S = (0.5, 2.0, 5.0)  # between attempts, and after a failure before the next call


@dataclass
class BackendStats:
    """What a backend did with its points (a point: one call, e.g. one step's scalars)."""
    sent: int = 0
    dropped: int = 0
    errors: int = 0
    last_error: str = ""
    pending: int = 0
    cpu_s: float = 0.0  # CPU time of the tracker's thread: what it took from the cores training runs on

    def as_dict(self) -> dict:
        """The numbers for ``summary.json``."""
        return {"sent": self.sent, "dropped": self.dropped, "errors": self.errors, "cpu_s": round(self.cpu_s, 3),
                **({"last_error": self.last_error} if self.last_error else {})}


@dataclass
class _Call:
    method: str
    args: tuple
    points: int = 1
    attempts: int = 0


@dataclass
class GuardedBackend:
    """Runs a backend's calls in a daemon thread, in order, behind a buffer of ``max_pending`` calls; the
    points of steps that wait are sent as one call, at most once per ``batch_s``."""
    backend: Backend
    max_pending: int
    warn: Callable[[str], None]
    on_drop: Callable[[int], None] = lambda n: None
    batch_s: float = 0.0
    stats: BackendStats = field(default_factory=BackendStats)

    def __post_init__(self) -> None:
        self._calls: deque[_Call] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._draining = False  # the run ended: send what waits now, without waiting for the interval
        self._warned = False
        self._opened = False
        self._last_send = 0.0
        self._thread = threading.Thread(target=self._work, name=f"tracking-{self.backend.name}", daemon=True)
        self._thread.start()

    @property
    def name(self) -> str:
        """The backend's name (tensorboard, mlflow, wandb)."""
        return self.backend.name

    def submit(self, method: str, *args, points: int = 1) -> None:
        """Queue a call; dropped and counted when ``max_pending`` calls already wait. Never blocks."""
        with self._cond:
            if self._closing:
                return
            if len(self._calls) >= self.max_pending:
                self._drop(points, f"{self.max_pending} points are waiting")
                return
            self._calls.append(_Call(method, args, points))
            self.stats.pending = len(self._calls)
            self._cond.notify()

    def _drop(self, points: int, why: str) -> None:
        self.stats.dropped += points
        self.on_drop(points)
        self._warn_once(f"tracking: {self.name} is behind ({why}); dropping points, training goes on and "
                        "metrics.jsonl is complete")

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            self.warn(message)

    def _next(self) -> _Call | None:
        """The call to make: waits for one; steps' points that wait are sent together, at most once per
        ``batch_s`` (one request instead of one per step spares the tracker, and the cores training runs on)."""
        with self._cond:
            while not self._calls and not self._closing:
                self._cond.wait()
            if not self._calls:
                return None
            if self._calls[0].method == "log":
                send_at = self._last_send + self.batch_s
                while not self._draining and time.monotonic() < send_at:
                    self._cond.wait(timeout=max(0.0, send_at - time.monotonic()))
                if self._calls[0].method == "log" and self._calls[0].attempts == 0:
                    batch = []
                    while self._calls and self._calls[0].method == "log" and self._calls[0].attempts == 0:
                        batch.append(self._calls.popleft())
                    self._calls.appendleft(_Call("log_many", ([c.args for c in batch],),
                                                 sum(c.points for c in batch)))
            return self._calls[0]

    def _work(self) -> None:
        while True:
            call = self._next()
            if call is None:
                return
            cpu = time.thread_time()
            ok = self._attempt(call)
            self.stats.cpu_s += time.thread_time() - cpu
            self._last_send = time.monotonic()
            with self._cond:
                if self._calls and self._calls[0] is call:
                    if ok or call.attempts >= RETRIES or self._closing:
                        self._calls.popleft()
                        if not ok:
                            self._drop(call.points, "its calls fail")
                self.stats.pending = len(self._calls)
                self._cond.notify_all()
            if not ok and not self._closing:
                time.sleep(PAUSE_S[min(call.attempts, len(PAUSE_S)) - 1])

    def _attempt(self, call: _Call) -> bool:
        call.attempts += 1
        try:
            if not self._opened:  # (re)open lazily: a tracker down at the start may come up later
                self.backend.open()
                self._opened = True
            if call.method != "open":
                getattr(self.backend, call.method)(*call.args)
            self.stats.sent += call.points
            return True
        except Exception as e:  # any failure of a tracker: counted, warned once, never raised into training
            self.stats.errors += 1
            self.stats.last_error = f"{type(e).__name__}: {e}"[:300]
            self._warn_once(f"tracking: {self.name} failed ({self.stats.last_error}); training goes on, "
                            f"metrics.jsonl is complete, up to {self.max_pending} points wait and are retried, "
                            "then dropped (mutualrl_tracking_dropped_points_total)")
            return False

    def close(self, timeout_s: float) -> None:
        """Let the buffer drain for up to ``timeout_s``; what is left is dropped and counted."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._draining = True
            self._cond.notify_all()
            while self._calls and time.monotonic() < deadline:
                self._cond.wait(timeout=min(0.2, max(0.0, deadline - time.monotonic())))
            self._closing = True
            left = sum(c.points for c in self._calls)
            self._calls.clear()
            self.stats.pending = 0
            self._cond.notify_all()
        if left:
            self._drop(left, f"the run ended with {left} points unsent after {timeout_s:g} s")
        self._thread.join(timeout=1.0)
