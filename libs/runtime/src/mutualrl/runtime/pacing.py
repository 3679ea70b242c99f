"""Paced stages for benchmarks of the schedule (benchmarks/bench_async.py): a stage that finishes early
sleeps out the rest of a fixed time, so what a run measures is how stages overlap and wait for each
other, not how fast two CPU cores generate or train.

``MUTUALRL_PACE="policy/stage=seconds,…"`` (stages: ``generate``, ``train``) sets a stage's time; a
stage that takes longer keeps its own time. Unset, :func:`pace` is a no-op (one environment lookup)."""

from __future__ import annotations

import os
import time

PACE_ENV = "MUTUALRL_PACE"


def paced_seconds(stage: str, policy: str) -> float | None:
    """The seconds ``policy``'s ``stage`` is paced to, or None (raises ValueError on a malformed setting)."""
    spec = os.environ.get(PACE_ENV)
    if not spec:
        return None
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{PACE_ENV}: {item!r} is not policy/stage=seconds")
        if key.strip() == f"{policy}/{stage}":
            return float(value)
    return None


def pace(stage: str, policy: str, started: float) -> float:
    """Sleep until ``stage`` has taken its paced seconds since ``started`` (a ``time.monotonic()``); the seconds
    slept (0 when unpaced or already over)."""
    target = paced_seconds(stage, policy)
    if target is None:
        return 0.0
    remaining = started + target - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)
    return max(0.0, remaining)
