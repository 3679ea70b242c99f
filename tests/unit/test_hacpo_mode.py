"""HACPO's learner mode says when it is not sharing: cross rows below the ratio's lower bound have no gradient
(docs/algorithms.md §2.7), and between two model families nearly all of them sit there."""

from __future__ import annotations

import logging

from mutualrl.config import AlgorithmConfig, SharingConfig
from mutualrl.services.learner.modes import make_mode
from mutualrl.services.learner.modes.hacpo import INERT_WARN_STEPS

LOGGER = "mutualrl.learner.hacpo"


def _step(mode, rows: int, below: float | None, ratio: float = 0.1) -> None:
    mode.report({"cross_rows": rows, "cross_discarded_frac": below, "cross_ratio_mean": ratio,
                 "cross_lower_bound": 0.8625, "self_clip_frac": 0.0}, rows, [], {})


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == LOGGER]


def test_hacpo_warns_once_a_streak_of_steps_keeps_no_cross_row_at_or_above_its_lower_bound(caplog):
    mode = make_mode("smollm2", AlgorithmConfig(), SharingConfig(mode="hacpo"), 8)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(INERT_WARN_STEPS - 1):
            _step(mode, 32, 1.0)
        assert _warnings(caplog) == []
        _step(mode, 32, 1.0, ratio=0.12)
        (msg,) = _warnings(caplog)
        assert "policy smollm2" in msg and f"for {INERT_WARN_STEPS} steps" in msg
        assert "ratio 0.12" in msg and "lower bound 0.863" in msg and "sgt_r" in msg
        assert "every own row is pushed down" in msg  # what still moves the policy: the mixed baseline (§2.3)
        for _ in range(INERT_WARN_STEPS):  # the same streak goes on: said once
            _step(mode, 32, 1.0)
        assert len(_warnings(caplog)) == 1


def test_a_step_with_a_cross_row_not_below_the_bound_ends_the_streak_and_steps_without_peers_do_not_count(caplog):
    mode = make_mode("qwen", AlgorithmConfig(), SharingConfig(mode="hacpo"), 8)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for below in (1.0, 1.0, 0.9375, 1.0, 1.0):  # step 3 keeps 2 of 32 rows not below: the streak starts again
            _step(mode, 32, below)
        _step(mode, 0, None)  # no peer rows this step (none arrived): neither sharing nor refusing to
        assert _warnings(caplog) == []
        _step(mode, 32, 1.0)
        assert len(_warnings(caplog)) == 1


def test_the_learners_prometheus_counter_splits_a_steps_cross_rows_by_where_they_sat():
    """``mutualrl_hacpo_cross_rows_total{where}``: exported at 0 from the start (the dashboard shows "none", not "no
    data"), then each step's cross rows split by the share below the bound; a step without cross rows adds nothing."""
    from prometheus_client import generate_latest

    from mutualrl.see import ExperienceExchange, InProcessBroker
    from mutualrl.services.learner.metrics import LearnerMetrics
    from mutualrl.services.learner.step_record import StepRecord

    m = LearnerMetrics("smollm2", ["qwen"], ExperienceExchange(InProcessBroker(), "mutualrl:t"))

    def value(where: str) -> float:
        return m.registry.get_sample_value("mutualrl_hacpo_cross_rows_total", {"policy": "smollm2", "where": where})

    assert value("not_below") == 0 and value("below_bound") == 0
    assert b'mutualrl_hacpo_cross_rows_total{policy="smollm2",where="not_below"} 0.0' in generate_latest(m.registry)
    for extra in ({"cross_rows": 32, "cross_discarded_frac": 0.96875}, {"cross_rows": 32, "cross_discarded_frac": 1.0},
                  {}, {"cross_rows": 0, "cross_discarded_frac": None}):
        m._observe_cross_rows(StepRecord.from_dict({"step": 1, "policy": "smollm2", **extra}))
    assert value("below_bound") == 31 + 32 and value("not_below") == 1
