"""``sgt_r``: a peer's verified success as a hint; the receiver learns from the completions it writes itself
(docs/algorithms.md §3.5 — our design, not the Mutual RL paper's SGT)."""

from __future__ import annotations

import torch
from typing_extensions import override

from mutualrl.grpo import grpo_advantages, rescue_advantages
from mutualrl.services.learner.hinted_rescue import EDGE_COUNTS
from mutualrl.services.learner.modes.base import SharingMode, group_ids, register_mode
from mutualrl.services.learner.objective import HINTED, OWN, Rows, StepAdvantages
from mutualrl.services.learner.peer_experience import PeerStats


@register_mode
class HintedSuccessTransfer(SharingMode):
    """Own groups at or under the gate that a peer solved get k rescue samples from the receiver's own engine, the
    peer's success shown as a hint (the second round: :class:`~mutualrl.services.learner.hinted_rescue.HintedRescue`).
    Here: own rows keep isolated GRPO's advantages; rescued rows get ``max(r − b, 0)/σ`` and train under the
    hint-free prompt, each token's advantage times its weight toward the hint-free policy. Settings:
    ``sharing.sgt_r``."""

    name = "sgt_r"
    section = "§3.5 SGT-R"
    peer_kinds = ("verified_success",)
    samples_rescues = True
    record_keys = (*EDGE_COUNTS, "hint_refused", "hint_delta_mean", "hint_weight_mean", "hint_floored_frac",
                   "hint_capped_frac")

    @override
    def gate_open(self, own_successes: dict[str, int], group_size: int) -> int:
        return sum(1 for n in own_successes.values() if n <= self.sh.sgt_r.gate_tau * group_size)

    @override
    def advantages(self, rows: Rows, peer_stats: dict[str, list[PeerStats]]) -> StepAdvantages:
        rewards, groups, kind = torch.tensor(rows.reward), group_ids(rows)[0], torch.tensor(rows.kind)
        own, hinted = kind == OWN, kind == HINTED
        adv = torch.zeros(len(rows))
        if own.any():  # the receiver's own groups as isolated GRPO sees them: rescues beside them change nothing
            adv[own] = grpo_advantages(rewards[own], groups[own], norm_by_std=self.a.norm_adv_by_std,
                                       epsilon=self.a.epsilon)
        if hinted.any():
            adv[hinted] = rescue_advantages(rewards[own], groups[own], rewards[hinted], groups[hinted],
                                            norm_by_std=self.a.norm_adv_by_std, epsilon=self.a.epsilon)
        return StepAdvantages(adv, torch.ones(len(rows)))

    @override
    def policy_gradient_rows(self, kind: torch.Tensor) -> torch.Tensor:
        return kind == HINTED  # against their hint-free log-probs at the start of the step (their ``logprobs``)
