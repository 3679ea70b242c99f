"""The learner is algorithm-blind: every sharing mode has a strategy registered under its name,
and the learner's code names no mode (it asks its strategy)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mutualrl.config import AlgorithmConfig, SharingConfig
from mutualrl.grpo.modes import SHARING_MODES
from mutualrl.services.learner import strategies
from mutualrl.services.learner.strategies import STRATEGIES, make_strategy

LEARNER = Path(strategies.__file__).with_name("learner.py")


def test_every_sharing_mode_has_a_strategy():
    assert set(STRATEGIES.names()) == set(SHARING_MODES.names())


def test_the_learner_names_no_mode():
    modes = set(SHARING_MODES.names()) - {"none"}  # "none" is also an ordinary word in messages
    tree = ast.parse(LEARNER.read_text())
    named = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)} & modes
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} & modes  # e.g. settings.sharing.hacpo
    assert not named and not attrs, f"learner.py names modes {named | attrs}: move the logic into the mode's strategy"


@pytest.mark.parametrize("mode,tracker", [("none", False), ("naive", False), ("prp", False), ("xgrpo", False), ("sgt", False), ("hacpo", True)])
def test_a_strategy_brings_a_capability_tracker_only_when_its_mode_weighs_peers(mode, tracker):
    s = make_strategy("me", AlgorithmConfig(), SharingConfig(mode=mode), 8)
    assert type(s).__name__ and (s.tracker is not None) == tracker
    calibrated = make_strategy("me", AlgorithmConfig(), SharingConfig(mode="xgrpo", xgrpo={"variant": "calibrated"}), 8)
    assert calibrated.tracker is not None
