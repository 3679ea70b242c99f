"""``none``: isolated GRPO (or GSPO, by ``algorithm.loss``) — each policy learns from its own rollouts only
(docs/algorithms.md §1)."""

from __future__ import annotations

from mutualrl.services.learner.modes.base import SharingMode, register_mode


@register_mode
class Isolated(SharingMode):
    """Own rows, group-relative advantages: the base class as it is."""

    name = "none"
    section = "§1"
