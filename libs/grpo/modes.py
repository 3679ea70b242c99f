"""The sharing modes: what each consumes from peers and where its formula lives.

A mode is data, not code: the learner reads ``peer_kinds`` to subscribe and
``peer_rows`` to know whether peer completions become training rows; the math
is in the pure functions each entry names. The config schema's
``sharing.mode`` literal must list exactly these names (a test checks it).
"""

from __future__ import annotations

from dataclasses import dataclass

from mutualrl.grpo.registry import Registry


@dataclass(frozen=True)
class SharingMode:
    """What a sharing mode needs from peers and which loss terms it adds (docs/algorithms.md §3.3)."""
    name: str
    peer_kinds: tuple[str, ...]  # SEE payload kinds the learner reads from peers
    peer_rows: bool  # peer completions (THL-converted) become training rows
    section: str  # where docs/algorithms.md specifies it
    summary: str


SHARING_MODES: Registry = Registry("sharing mode")

for _mode in (
    SharingMode("none", (), False, "§1", "isolated: each policy learns from its own rollouts only"),
    SharingMode("naive", ("rollout",), True, "§2.9", "peer rollouts pooled into the group with no corrections (the failing baseline)"),
    SharingMode("prp", ("rollout",), True, "§3.3 PRP", "pooled group, recomputed advantages, truncated density ratio, THL residual gate"),
    SharingMode("xgrpo", ("advantage_stats",), False, "§3.3 XGRPO", "own rollouts only; baseline and scale from peers' AdvantageStats"),
    SharingMode("sgt", ("verified_success",), False, "§3.3 SGT", "re-verified peer successes as a rescue set on own all-fail groups"),
    SharingMode("hacpo", ("rollout",), True, "§2.7", "capability-aware advantage, exponential IS, stepwise clipping, ω"),
):
    SHARING_MODES.register(_mode.name)(_mode)


def get_sharing_mode(name: str) -> SharingMode:
    return SHARING_MODES.get(name)
