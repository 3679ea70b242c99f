"""The controller judges re-plans by the rule the simulator proves: the first plan from
measurements only needs the small calibration bar (it replaces seeded guesses), every later one
the 10 % hysteresis, whether or not the first was adopted."""

from __future__ import annotations

from pathlib import Path

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


def _judgements(monkeypatch) -> list[tuple[float, float]]:
    """(move cost, minimum gain) of every re-plan judgement the controller makes from now on."""
    seen: list[tuple[float, float]] = []
    real = controller_module.decide_replan

    def spy(demands, current, candidate, remaining, move_cost_s, min_gain):
        seen.append((move_cost_s, min_gain))
        return real(demands, current, candidate, remaining, move_cost_s, min_gain)

    monkeypatch.setattr(controller_module, "decide_replan", spy)
    return seen


def test_the_first_measured_plan_gets_the_calibration_bar_and_later_ones_the_hysteresis(monkeypatch):
    seen = _judgements(monkeypatch)
    controller = Controller(InMemoryBackend([Node(f"n{i}", 8) for i in range(4)]))
    exp = controller.submit(parse_config(YAML, "t", check_paths=False), YAML)
    for step in (1, 2, 3):
        _measure(controller, exp.id, step)
    # one judgement per finished measurement once both policies have one: 1 at step 1, 2 at steps 2 and 3
    assert [b for _, b in seen] == [CALIBRATION_GAIN] + [exp.config.mwra.min_gain] * 4 == [CALIBRATION_GAIN] + [0.10] * 4
    assert exp.calibrated
    # the simulator's MWRA, whose plans the benchmark proves, uses the same bar
    assert Mwra(move_cost_s=120.0).calibration_gain == controller.calibration_gain == CALIBRATION_GAIN


def test_each_experiment_is_judged_by_its_own_mwra_settings(monkeypatch):
    """`mwra.min_gain`, `move_cost_s` and `ema_alpha` in the experiment file are what the controller
    uses for that experiment (they were documented but the controller used its own defaults)."""
    seen = _judgements(monkeypatch)
    text = YAML.replace("mwra:\n", "mwra:\n  min_gain: 0.25\n  move_cost_s: 30\n  ema_alpha: 0.5\n")
    controller = Controller(InMemoryBackend([Node(f"n{i}", 8) for i in range(4)]))
    exp = controller.submit(parse_config(text, "t", check_paths=False), text)
    assert exp.measured.alpha == 0.5
    for step in (1, 2):
        _measure(controller, exp.id, step)
    assert seen == [(30.0, CALIBRATION_GAIN), (30.0, 0.25), (30.0, 0.25)]
