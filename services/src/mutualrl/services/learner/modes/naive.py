"""``naive``: peer rollouts pooled into the group with no corrections — the failing baseline (docs/algorithms.md
§2.9)."""

from __future__ import annotations

import torch
from typing_extensions import override

from mutualrl.services.learner.modes.base import SharingMode, register_mode
from mutualrl.services.learner.objective import PEER


@register_mode
class Naive(SharingMode):
    """Peer rows pooled into the group and trained with ratio 1, as if the learner sampled them."""

    name = "naive"
    section = "§2.9"
    peer_kinds = ("rollout",)

    @override
    def on_policy_rows(self, kind: torch.Tensor) -> torch.Tensor:
        return kind == PEER
