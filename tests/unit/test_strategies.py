"""The learner is algorithm-blind: every sharing mode is one class registered under its name,
the config's literal lists exactly those names, and no mode is named outside its class."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from mutualrl.config import AlgorithmConfig, SharingConfig
from mutualrl.services.learner import modes as modes_pkg
from mutualrl.services.learner.modes import MODES, make_mode, record_keys

LEARNER_DIR = Path(modes_pkg.__file__).parent.parent
SERVICES = LEARNER_DIR.parent


def test_the_config_literal_lists_exactly_the_registered_modes():
    literal = typing.get_args(SharingConfig.model_fields["mode"].annotation)
    assert sorted(literal) == MODES.names() == ["hacpo", "naive", "none", "prp", "sgt", "sgt_r", "xgrpo"]
    assert MODES.get("xgrpo").peer_kinds == ("advantage_stats",)
    assert record_keys() == tuple(sorted(("sgt_nll", *MODES.get("sgt_r").record_keys)))
    assert [n for n in MODES.names() if MODES.get(n).samples_rescues] == ["sgt_r"]
    with pytest.raises(ValueError, match="valid: hacpo, naive, none, prp, sgt, sgt_r, xgrpo"):
        MODES.get("gossip")


def _names_modes(path: Path) -> set[str]:
    modes = set(MODES.names()) - {"none"}  # "none" is also an ordinary word in messages
    tree = ast.parse(path.read_text())
    named = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)} & modes
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} & modes  # e.g. settings.sharing.hacpo
    return named | attrs


def test_no_service_names_a_mode_outside_its_class():
    """A mode's name appears only in its own module under ``modes/`` (and the registry there)."""
    offenders = {}
    for path in sorted(SERVICES.rglob("*.py")):
        # MWRA's strategies are allocation plans, not sharing modes
        if path.parent.name == "modes" or "mwra" in path.parts:
            continue
        if named := _names_modes(path):
            offenders[str(path.relative_to(SERVICES))] = named
    assert not offenders, f"modes named outside their classes: {offenders}"


@pytest.mark.parametrize("mode,tracker",
                         [("none", False), ("naive", False), ("prp", False), ("xgrpo", False), ("sgt", False),
                          ("sgt_r", False),
                          ("hacpo", True)])
def test_a_strategy_brings_a_capability_tracker_only_when_its_mode_weighs_peers(mode, tracker):
    s = make_mode("me", AlgorithmConfig(), SharingConfig(mode=mode), 8)
    assert type(s).__name__ and (s.tracker is not None) == tracker
    calibrated = make_mode("me", AlgorithmConfig(), SharingConfig(mode="xgrpo", xgrpo={"variant": "calibrated"}), 8)
    assert calibrated.tracker is not None
