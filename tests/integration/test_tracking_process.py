"""Trackers in a child process (``tracking.isolation: process``, docs/tracking.md): the training process
only pipes records; the child runs at low CPU priority, reports what it sent and dropped, and a child that
dies or hangs costs the run nothing but its tracker points (counted)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mutualrl.config.tracking import TrackingConfig
from mutualrl.tracking import RunInfo, open_tracker
from mutualrl.tracking.process import FINISH_MARGIN_S, NICE, ProcessTracker


def _record(step: int) -> dict:
    return {"step": step, "policy": "llama", "rollouts": 32 * step, "reward_mean": 0.1 * step,
            "eval_accuracy": 0.25, "loss": 1.0 / step}


def _open(tmp_path: Path, said: list[str], registry=None, **cfg) -> ProcessTracker:
    t = open_tracker(TrackingConfig(backends=["jsonl", "tensorboard"], isolation="process", **cfg),
                     RunInfo("exp", "llama", "g", tmp_path, tags={"seed": "0"}, params={"optim.lr": 0.1}),
                     said.append, registry=registry)
    assert isinstance(t, ProcessTracker)
    return t


def test_records_reach_tensorboard_through_a_low_priority_child(tmp_path):
    said: list[str] = []
    t = _open(tmp_path, said, flush_every_s=0.2)
    assert os.getpriority(os.PRIO_PROCESS, t.proc.pid) >= NICE
    t0 = time.monotonic()
    for step in range(1, 6):
        t.log(_record(step))
    assert time.monotonic() - t0 < 0.1  # a record is a line queued for a pipe
    stats = t.finish({"final_accuracy": 0.5})
    assert stats["tensorboard"]["sent"] == 5 and stats["tensorboard"]["dropped"] == 0 and said == []
    assert t.proc.returncode == 0
    acc = EventAccumulator(str(tmp_path / "tensorboard" / "llama"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("train/reward_mean")] == pytest.approx([0.1 * s for s in range(1, 6)])
    assert [e.step for e in acc.Scalars("train/reward_mean")] == [1, 2, 3, 4, 5]


def test_a_child_killed_mid_run_is_warned_about_once_and_its_points_counted(tmp_path):
    said: list[str] = []
    registry = CollectorRegistry()
    t = _open(tmp_path, said, registry=registry)
    t.log(_record(1))
    t.proc.send_signal(signal.SIGKILL)
    t.proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while not said and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    for step in range(2, 12):
        t.log(_record(step))
    assert time.monotonic() - t0 < 0.1
    stats = t.finish({})
    assert len(said) == 1 and "exited with code -9" in said[0] and "metrics.jsonl" in said[0]
    assert stats["tensorboard"]["dropped"] >= 10 and t.dropped() >= 10
    text = generate_latest(registry).decode()
    dropped = [line for line in text.splitlines()
               if line.startswith('mutualrl_tracking_dropped_points_total{backend="tensorboard",policy="llama"}')]
    assert dropped and float(dropped[0].split()[-1]) >= 10


def test_a_hung_child_never_blocks_training_and_finish_is_bounded(tmp_path):
    said: list[str] = []
    t = _open(tmp_path, said, max_pending=20, timeout_s=1.0)
    deadline = time.monotonic() + 60
    while not t._ready.is_set() and time.monotonic() < deadline:  # started: the grace for imports is over
        time.sleep(0.05)
    os.kill(t.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        for step in range(1, 3001):  # ~1 MB: more than a pipe holds, so the queue fills and the rest is dropped
            t.log({**_record(step), "pad": "x" * 300})
        assert time.monotonic() - t0 < 2.0
        t0 = time.monotonic()
        stats = t.finish({})
        assert time.monotonic() - t0 < 1.0 + FINISH_MARGIN_S + 2  # timeout_s, the margin, then killed
    finally:
        if t.proc.poll() is None:
            t.proc.kill()
    assert stats["tensorboard"]["dropped"] >= 2900
    assert len(said) == 1 and "behind" in said[0]  # once per run: the stop at the end is not said again


def test_mlflow_without_a_uri_is_off_with_one_line_from_the_child(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    said: list[str] = []
    cfg = TrackingConfig(backends=["jsonl", "mlflow"], isolation="process")
    t = open_tracker(cfg, RunInfo("e", "p", "g", tmp_path), said.append)
    t.log(_record(1))
    stats = t.finish({})
    assert said == ["tracking: mlflow is off for this run: no MLflow tracking URI: set tracking.mlflow.tracking_uri "
                    "or MLFLOW_TRACKING_URI"]
    assert t.proc.returncode == 0 and stats["mlflow"]["sent"] == 0
