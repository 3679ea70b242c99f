"""Calls run on one thread: the thread that owns a service's torch work.

Why a service needs this: PyTorch's CPU kernels parallelise with OpenMP (libgomp), and every thread that runs a
parallel kernel gets an OpenMP team of its own, kept for as long as that thread lives. Once a process holds more
OpenMP threads than it has CPUs, libgomp stops letting an idle team member spin between parallel regions (its
throttled spin count): the member sleeps and must be woken for each kernel, and a generation — thousands of small
kernels — runs a fifth to a third slower, at ~1.6 of 2 cores. A rollout service whose weights follower loaded each
version on the follower's own thread generated that much slower from its first load on, with the follower idle the
whole time (docs/results/real/bench-vs-trl.md, "`up`'s generation after a weights load").

So a service keeps its engine on its main thread: other threads (the weights follower, the rescue responder, gRPC
handlers) hand their engine calls over with :meth:`OwnerThread.call` and wait, and the main thread runs them
whenever it waits itself (:meth:`OwnerThread.run_pending`). Calls are run one at a time in the order given, so they
never interleave with each other or with the owner's own use of the engine, as the engine's lock had ensured.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable


class OwnerThreadStopped(Exception):  # noqa: N818 - what happened, as VersionSuperseded says
    """The owner thread stopped taking calls (its service is shutting down). Not a RuntimeError: a weights follower
    counts those as a refused version, and a load cut short by shutdown is none."""


class OwnerThread:
    """Runs calls on the thread that created it. A call from that thread runs at once; a call from another thread
    is queued and waits until the owner runs it (:meth:`run_pending`), then returns its result or raises its
    exception."""

    def __init__(self) -> None:
        self._owner = threading.get_ident()
        self._calls: queue.SimpleQueue[tuple[Callable[..., Any], tuple, dict, Future]] = queue.SimpleQueue()
        self._closed = False

    @property
    def on_owner(self) -> bool:
        """Whether the calling thread is the owner."""
        return threading.get_ident() == self._owner

    def call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the owner thread (directly when called from it)."""
        if self.on_owner:
            return fn(*args, **kwargs)
        if self._closed:
            raise OwnerThreadStopped(f"{getattr(fn, '__name__', fn)}: the service's main thread takes no more calls")
        done: Future = Future()
        self._calls.put((fn, args, kwargs, done))
        if self._closed:  # closed between the check and the put: close() may have drained the queue already
            self._fail_pending()
        return done.result()

    def run_pending(self, wait_s: float = 0.0) -> int:
        """On the owner thread: run the calls queued, waiting up to ``wait_s`` for the first (a waiting owner
        calls this in place of sleeping). Returns how many ran."""
        if not self.on_owner:
            raise RuntimeError("run_pending is for the owner thread")
        try:
            item = self._calls.get(timeout=wait_s) if wait_s > 0 else self._calls.get_nowait()
        except queue.Empty:
            return 0
        ran = 0
        while True:
            fn, args, kwargs, done = item
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(fn(*args, **kwargs))
                except BaseException as e:  # noqa: BLE001 - handed to the caller, which raises it
                    done.set_exception(e)
            ran += 1
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                return ran

    def close(self) -> None:
        """Take no more calls; the ones still queued raise :class:`OwnerThreadStopped` in their callers."""
        self._closed = True
        self._fail_pending()

    def _fail_pending(self) -> None:
        while True:
            try:
                fn, _, _, done = self._calls.get_nowait()
            except queue.Empty:
                return
            if done.set_running_or_notify_cancel():
                done.set_exception(OwnerThreadStopped(f"{getattr(fn, '__name__', fn)}: the service stopped before "
                                                      "its main thread ran this call"))
