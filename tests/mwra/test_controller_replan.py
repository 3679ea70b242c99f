"""The controller judges re-plans by the rule the simulator proves: the first plan from
measurements only needs the small calibration bar (it replaces seeded guesses), and so does the
first once every policy has a full window of measurements (it replaces one-sample costs); every
other one the 10 % hysteresis, whether or not the calibrations were adopted."""

from __future__ import annotations

from pathlib import Path

import pytest

import mutualrl.services.mwra.controller as controller_module
from mutualrl.config import parse_config
from mutualrl.services.mwra.backends.base import InMemoryBackend
from mutualrl.services.mwra.controller import Controller
from mutualrl.services.mwra.planner import CALIBRATION_GAIN, Node
from mutualrl.services.mwra.simulator import Mwra

ROOT = Path(__file__).resolve().parents[2]
YAML = (ROOT / "examples" / "mwra" / "two-policies-gpu.yaml").read_text()


def _measure(controller: Controller, exp_id: str, step: int) -> None:
    for policy in ("small", "large"):
        controller.report_step(exp_id, policy, "rollout", step, {"generate": 10.0})
        controller.report_step(exp_id, policy, "learner", step, {"train": 10.0})


def _judgements(monkeypatch) -> tuple[list[tuple[float, float]], list[dict[str, float]]]:
    """(move cost, minimum gain) of every re-plan judgement the controller makes from now on, and
    the W per policy each one planned with."""
    seen: list[tuple[float, float]] = []
    costs: list[dict[str, float]] = []
    real = controller_module.decide_replan

    def spy(demands, current, candidate, remaining, move_cost_s, min_gain):
        seen.append((move_cost_s, min_gain))
        costs.append({d.name: d.step_gpu_seconds for d in demands})
        return real(demands, current, candidate, remaining, move_cost_s, min_gain)

    monkeypatch.setattr(controller_module, "decide_replan", spy)
    return seen, costs


def test_the_first_measured_plan_gets_the_calibration_bar_and_later_ones_the_hysteresis(monkeypatch):
    seen, _ = _judgements(monkeypatch)
    controller = Controller(InMemoryBackend([Node(f"n{i}", 8) for i in range(4)]))
    exp = controller.submit(parse_config(YAML, "t", check_paths=False), YAML)
    for step in (1, 2, 3):
        _measure(controller, exp.id, step)
    # the first calibration once both policies have a measurement; then nothing until a full window: an average
    # of a few noisy steps is not drift
    assert exp.config.mwra.min_gain == 0.10
    assert [b for _, b in seen] == [CALIBRATION_GAIN]
    assert exp.schedule.calibrations == 1
    # the simulator's MWRA, whose plans the benchmark proves, uses the same bar
    assert Mwra(move_cost_s=120.0).schedule.calibration_gain == controller.calibration_gain == CALIBRATION_GAIN


def test_each_experiment_is_judged_by_its_own_mwra_settings(monkeypatch):
    """`mwra.min_gain`, `move_cost_s` and `ema_alpha` in the experiment file are what the controller
    uses for that experiment (they were documented but the controller used its own defaults)."""
    seen, _ = _judgements(monkeypatch)
    text = YAML.replace("mwra:\n", "mwra:\n  min_gain: 0.25\n  move_cost_s: 30\n  ema_alpha: 0.5\n")
    controller = Controller(InMemoryBackend([Node(f"n{i}", 8) for i in range(4)]))
    exp = controller.submit(parse_config(text, "t", check_paths=False), text)
    assert exp.measured.alpha == 0.5
    for step in range(1, exp.measured.window + 2):
        _measure(controller, exp.id, step)
    assert seen[:2] == [(30.0, CALIBRATION_GAIN), (30.0, CALIBRATION_GAIN)]
    assert seen[2:] and set(seen[2:]) == {(30.0, 0.25)}


def test_a_full_window_of_measurements_is_judged_once_more_as_calibration_on_the_window_line(monkeypatch):
    seen, costs = _judgements(monkeypatch)
    controller = Controller(InMemoryBackend([Node(f"n{i}", 8) for i in range(4)]))
    exp = controller.submit(parse_config(YAML, "t", check_paths=False), YAML)
    window = exp.measured.window
    for step in range(1, window + 3):
        _measure(controller, exp.id, step)
    bars = [b for _, b in seen]
    # the first judgement needs both policies' first measurement; the next is the full window ("large"'s 60th
    # measurement), then cost drift (the calibrations moved nothing: every step cost the same, so no dwell)
    assert [i for i, b in enumerate(bars) if b == CALIBRATION_GAIN] == [0, 1]
    assert set(bars[2:]) == {exp.config.mwra.min_gain}
    assert exp.schedule.calibrations == 2
    # every step reported the same seconds, so the window's line gives the same W as the average
    assert costs[1] == pytest.approx(costs[2])
