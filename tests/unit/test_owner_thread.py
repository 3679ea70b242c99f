"""mutualrl.runtime.owner_thread: calls from other threads run on the owner thread, one at a time, in order, with
their results and exceptions handed back; a closed owner refuses what is queued and what comes after."""

from __future__ import annotations

import threading
import time

from mutualrl.runtime.owner_thread import OwnerThread, OwnerThreadStopped


def _in_thread(fn):
    out: dict = {}

    def run():
        try:
            out["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - the test reads it
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def _pump_until(owner: OwnerThread, threads, timeout: float = 10.0) -> int:
    ran, deadline = 0, time.monotonic() + timeout
    while any(t.is_alive() for t in threads):
        assert time.monotonic() < deadline, "calls were not run"
        ran += owner.run_pending(0.01)
    return ran


def test_the_owners_own_call_runs_at_once():
    owner = OwnerThread()
    assert owner.on_owner and owner.call(lambda a, b=0: a + b, 2, b=3) == 5


def test_a_call_from_another_thread_runs_on_the_owner_and_returns_its_result():
    owner = OwnerThread()
    me = threading.get_ident()
    t, out = _in_thread(lambda: owner.call(threading.get_ident))
    time.sleep(0.05)
    assert t.is_alive() and not out  # it waits for the owner
    assert _pump_until(owner, [t]) == 1
    assert out["result"] == me


def test_an_exception_is_raised_in_the_caller_and_the_owner_goes_on():
    owner = OwnerThread()

    def fails():
        raise ValueError("bad weights")

    t, out = _in_thread(lambda: owner.call(fails))
    _pump_until(owner, [t])
    assert isinstance(out["error"], ValueError) and "bad weights" in str(out["error"])
    t2, out2 = _in_thread(lambda: owner.call(lambda: "next"))
    _pump_until(owner, [t2])
    assert out2["result"] == "next"


def test_calls_run_one_at_a_time_in_the_order_given():
    owner = OwnerThread()
    order, running, overlaps = [], [], []

    def work(i):
        if running:
            overlaps.append(i)
        running.append(i)
        time.sleep(0.01)
        order.append(i)
        running.remove(i)
        return i

    threads = []
    for i in range(5):
        t, _ = _in_thread(lambda i=i: owner.call(work, i))
        threads.append(t)
        time.sleep(0.02)  # queued in this order
    _pump_until(owner, threads)
    assert order == [0, 1, 2, 3, 4] and not overlaps


def test_a_closed_owner_refuses_queued_and_later_calls():
    owner = OwnerThread()
    t, out = _in_thread(lambda: owner.call(lambda: "never run"))
    time.sleep(0.05)
    owner.close()
    t.join(timeout=10)
    assert isinstance(out["error"], OwnerThreadStopped)
    t2, out2 = _in_thread(lambda: owner.call(lambda: "never run"))
    t2.join(timeout=10)
    assert isinstance(out2["error"], OwnerThreadStopped)
    assert not issubclass(OwnerThreadStopped, RuntimeError)  # a follower would count it as a refused version


def test_only_the_owner_runs_pending_calls():
    owner = OwnerThread()
    t, out = _in_thread(lambda: owner.run_pending())
    t.join(timeout=10)
    assert isinstance(out["error"], RuntimeError) and "owner thread" in str(out["error"])
    assert owner.run_pending() == 0  # nothing queued: returns at once
    t0 = time.monotonic()
    assert owner.run_pending(0.05) == 0 and time.monotonic() - t0 >= 0.04  # waits in place of a sleep
