"""What a tracker is sent (docs/tracking.md, "Logged keys"): a metrics record as named scalars, the config as
flat parameters, and the guard that keeps a failing or slow tracker away from training."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from mutualrl.config import ConfigError, parse_config
from mutualrl.config.tracking import TrackingConfig
from mutualrl.tracking import Backend, DropCounter, RunInfo, open_tracker
from mutualrl.tracking.guard import GuardedBackend
from mutualrl.tracking.points import by_rollouts, flatten, params, scalars, summary_scalars

RECORD = {"step": 3, "policy": "llama", "reward_mean": 0.25, "loss": float("nan"), "kl": 0.0, "clip_frac": 0.125,
          "grad_norm": 2.0, "stage_seconds": {"train": 1.5, "wait": 0.25}, "tokens": 300, "step_s": 2.0,
          "stage_peak_rss_gib": {"train": 6.5, "weight_sync": 4.25},
          "peer_rejected": {"roundtrip": 2, "stale": 1}, "rescue_count": 4, "peer_rows": 6,
          "thl_residual": 0.01, "thl_by_source": {"qwen": {"messages": 5, "unaligned_mean": 0.0}},
          "eval_accuracy": 0.5, "rollouts": 192, "reputation_events": [{"peer": "qwen"}], "wall_time": 1.0,
          "mystery": 7, "phase": "rl"}


def test_a_record_becomes_grouped_scalars_and_nothing_numeric_is_lost():
    s = scalars(RECORD)
    assert s["train/reward_mean"] == 0.25 and s["train/kl"] == 0.0 and s["train/clip_frac"] == 0.125
    assert "train/loss" not in s  # a NaN is not a point
    assert s["time/train_s"] == 1.5 and s["time/wait_s"] == 0.25 and s["time/step_s"] == 2.0
    assert s["memory/train_peak_gib"] == 6.5 and s["memory/weight_sync_peak_gib"] == 4.25
    assert s["throughput/tokens_per_s"] == 150.0  # 300 tokens in 2 s
    assert s["sharing/rejected/roundtrip"] == 2 and s["sharing/peer_rows_rejected"] == 3
    assert s["sharing/rescues"] == 4 and s["sharing/peer_rows_used"] == 6
    assert s["thl/residual"] == 0.01
    assert s["edge/qwen/messages"] == 5 and s["edge/qwen/unaligned_mean"] == 0.0  # the incoming edge qwen -> llama
    assert s["eval/accuracy"] == 0.5 and s["progress/rollouts"] == 192
    assert s["other/mystery"] == 7  # an unknown field is kept, under other/
    assert not any(k.startswith(("other/step", "other/wall", "other/phase", "other/reputation")) for k in s)
    assert by_rollouts(RECORD) == (192, {"by_rollouts/reward_mean": 0.25, "by_rollouts/eval_accuracy": 0.5})
    assert by_rollouts({"step": 1}) is None


def test_config_flattens_to_parameters_and_the_summary_to_final_numbers():
    assert flatten({"a": {"b": 1, "c": [{"d": None}]}, "e": []}) == {"a.b": 1, "a.c.0.d": None, "e": "[]"}
    assert params({"a": {"b": None, "c": [1, 2]}}) == {"a.b": "null", "a.c.0": 1, "a.c.1": 2}
    assert summary_scalars({"final_accuracy": 0.4, "source": "built", "rollouts": 10}) == {
        "final/final_accuracy": 0.4, "final/rollouts": 10.0}


@pytest.mark.parametrize("tracking, message", [
    ({"backends": ["tensorboard"]}, "must keep jsonl"),
    ({"backends": ["jsonl", "neptune"]}, "neptune"),
    ({"backends": ["jsonl", "mlflow", "mlflow"]}, "repeats mlflow"),
    ({"mlflow": {"tracking_uri": " "}}, "tracking_uri is empty"),
    ({"wandb": {"mode": "sometimes"}}, "offline"),
    ({"tags": {"bad tag!": "x"}}, "bad tag name"),
    ({"max_pending": 0}, "max_pending"),
    ({"backend": ["jsonl"]}, "backend"),  # a typo is an error, not ignored
])
def test_a_bad_tracking_section_is_refused_with_a_clear_message(tracking, message):
    cfg = {"name": "t", "policies": [{"name": "a", "model": {"family": "llama"}, "tokenizer": {"kind": "char"}}],
           "tracking": tracking}
    with pytest.raises(ConfigError, match=message):
        parse_config(yaml.safe_dump(cfg))


class _Flaky(Backend):
    """A tracker that fails (or hangs) on demand, to see what the guard does (``log_many``: the interface's own)."""
    name = "flaky"

    def __init__(self, fail: bool = False, hang: threading.Event | None = None):
        self.fail, self.hang, self.logged = fail, hang, []

    def open(self):
        if self.fail:
            raise ConnectionError("refused")

    def log(self, step, values):
        if self.hang is not None:
            self.hang.wait()
        if self.fail:
            raise ConnectionError("refused")
        self.logged.append(step)

    def finish(self, summary):
        pass


def test_a_down_tracker_is_warned_about_once_and_its_points_are_counted_as_dropped(monkeypatch):
    monkeypatch.setattr("mutualrl.tracking.guard.PAUSE_S", (0.01, 0.01, 0.01))
    registry = CollectorRegistry()
    warnings: list[str] = []
    g = GuardedBackend(_Flaky(fail=True), 100, warnings.append, DropCounter(registry).callback("flaky", "llama"))
    for step in range(5):
        g.submit("log", step, {"x": 1.0})
    g.close(timeout_s=5)
    assert g.stats.dropped == 5 and g.stats.sent == 0 and g.stats.errors >= 3  # each call tried 3 times
    assert len(warnings) == 1 and "refused" in warnings[0] and "metrics.jsonl is complete" in warnings[0]
    assert 'mutualrl_tracking_dropped_points_total{backend="flaky",policy="llama"} 5.0' in generate_latest(
        registry).decode()


def test_a_hung_tracker_never_blocks_the_caller_and_drops_beyond_its_bound():
    hang = threading.Event()
    warnings: list[str] = []
    g = GuardedBackend(_Flaky(hang=hang), 3, warnings.append)
    t0 = time.monotonic()
    for step in range(50):
        g.submit("log", step, {"x": 1.0})
    assert time.monotonic() - t0 < 0.5  # submitting is appending to a buffer
    g.close(timeout_s=0.2)  # the run ends: what is left is dropped, the hung call is abandoned
    hang.set()
    assert g.stats.dropped >= 46 and len(warnings) == 1 and "behind" in warnings[0]


def test_a_tracker_whose_library_is_missing_gets_a_one_line_hint(monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    said: list[str] = []
    t = open_tracker(TrackingConfig(backends=["jsonl", "wandb"]), RunInfo("e", "p", "g", Path(tmp_path)), said.append)
    assert t.backends == [] and len(said) == 1
    assert "wandb is not installed" in said[0] and "mutualrl[tracking]" in said[0] and "\n" not in said[0]


def test_mlflow_without_a_tracking_uri_is_off_with_a_reason(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    said: list[str] = []
    cfg = TrackingConfig(backends=["jsonl", "mlflow"], isolation="thread")
    t = open_tracker(cfg, RunInfo("e", "p", "g", Path(tmp_path)), said.append)
    assert t.backends == [] and said == [
        "tracking: mlflow is off for this run: no MLflow tracking URI: set tracking.mlflow.tracking_uri or "
        "MLFLOW_TRACKING_URI"]


def test_steps_that_wait_reach_a_tracker_in_one_call_at_most_once_per_interval():
    class Counting(_Flaky):
        def __init__(self):
            super().__init__()
            self.calls: list[list[int]] = []

        def log_many(self, points):
            self.calls.append([step for step, _ in points])

    b = Counting()
    g = GuardedBackend(b, 100, print, batch_s=0.3)
    g.submit("log", 1, {"x": 1.0})
    time.sleep(0.05)
    for step in range(2, 6):
        g.submit("log", step, {"x": 1.0})
    g.submit("finish", {}, points=0)
    g.close(timeout_s=5)
    assert [s for call in b.calls for s in call] == [1, 2, 3, 4, 5]  # every point, in order
    assert len(b.calls) <= 2 and g.stats.sent == 5 and g.stats.dropped == 0


def test_the_end_of_a_run_sends_what_waits_without_waiting_for_the_interval():
    b = _Flaky()
    g = GuardedBackend(b, 100, print, batch_s=60)
    g.submit("log", 1, {"x": 1.0})
    time.sleep(0.1)
    g.submit("log", 2, {"x": 1.0})  # waits for the 60 s interval...
    t0 = time.monotonic()
    g.close(timeout_s=5)  # ...until the run ends
    assert b.logged == [1, 2] and g.stats.dropped == 0 and time.monotonic() - t0 < 2
