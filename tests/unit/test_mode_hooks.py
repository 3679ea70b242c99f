"""The sharing-mode interface as the learner uses it: per step it calls at most five entry points of its mode
(begin_step, advantages, report; the update's minibatches and minibatch_loss), and each is defined on the base
class, so a mode overrides the finer hooks behind them and the learner never grows a question per mode."""

from __future__ import annotations

import ast
from pathlib import Path

from mutualrl.services.learner.modes.base import SharingMode

LEARNER = Path(__file__).resolve().parents[2] / "services" / "src" / "mutualrl" / "services" / "learner"
ENTRY_POINTS = {"begin_step", "advantages", "report", "minibatches", "minibatch_loss"}


def _mode_calls(path: Path, skip: set[str]) -> set[str]:
    """Methods called as ``self.mode.<name>(...)`` outside the functions named in ``skip`` (construction)."""
    calls: set[str] = set()
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, ast.FunctionDef) or fn.name in skip:
            continue
        for node in ast.walk(fn):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "mode"):
                calls.add(node.func.attr)
    return calls


def test_the_learner_asks_its_mode_at_most_five_things_a_step():
    per_step = _mode_calls(LEARNER / "learner.py", {"__init__"}) | _mode_calls(LEARNER / "update.py", {"__init__"})
    assert per_step == ENTRY_POINTS, per_step
    assert len(per_step) <= 5
    for name in per_step:  # every entry point has the base class's definition to fall back on
        assert callable(getattr(SharingMode, name)), name
