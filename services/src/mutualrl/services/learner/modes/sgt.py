"""``sgt``: success-gated transfer — re-verified peer successes as a rescue set on own all-fail groups
(docs/algorithms.md §3.3 SGT)."""

from __future__ import annotations

import torch
from typing_extensions import override

from mutualrl.grpo import RescueItem, group_insert_advantages, select_rescues, sgt_nll, sgt_token_weights
from mutualrl.models.generation import sequence_logprobs
from mutualrl.services.learner.modes.base import SharingMode, group_ids, register_mode
from mutualrl.services.learner.objective import OWN, RESCUE, Rows, StepAdvantages
from mutualrl.services.learner.peer_experience import IntakeResult, PeerStats
from mutualrl.services.learner.success_bank import SuccessBank


@register_mode
class SuccessGatedTransfer(SharingMode):
    """Re-verified peer successes on own groups at or under the gate (τ·G own successes), K_r per prompt
    (the shortest, or any): a λ-weighted NLL term (``nll``, optionally style-guarded per token) or rows
    inserted into the group (``group_insert``). Settings: ``sharing.sgt``."""

    name = "sgt"
    section = "§3.3 SGT"
    peer_kinds = ("verified_success",)
    record_keys = ("sgt_nll",)

    @override
    def success_bank(self) -> SuccessBank | None:
        s = self.sh.sgt
        return SuccessBank(s.bank_prompts, s.max_per_prompt, s.bank_max_age) if s.bank_prompts else None

    @override
    def gate_open(self, own_successes: dict[str, int], group_size: int) -> int:
        return sum(1 for n in own_successes.values() if n <= self.sh.sgt.gate_tau * group_size)

    @override
    def rescues(self, rows: Rows, intake: IntakeResult, own_successes: dict[str, int],
                group_size: int) -> list[RescueItem]:
        g = self.sh.sgt
        rescues = select_rescues(intake.rescues, own_successes, group_size, g.gate_tau, g.max_per_prompt,
                                 shortest_first=g.select == "shortest")
        if g.variant == "group_insert":
            for x in rescues:
                n = len(x.token_ids)
                rows.add(prompt_token_ids=x.prompt_token_ids, token_ids=x.token_ids, logprobs=[0.0] * n, mask=[1.0] * n,
                         reward=1.0,
                         prompt_id=x.prompt_id, source_policy=x.source_policy, kind=RESCUE, source_mean_logprob=0.0)
        return rescues

    @override
    def advantages(self, rows: Rows, peer_stats: dict[str, list[PeerStats]]) -> StepAdvantages:
        if self.sh.sgt.variant == "nll":
            return super().advantages(rows, peer_stats)
        rewards, groups, kind = torch.tensor(rows.reward), group_ids(rows)[0], torch.tensor(rows.kind)
        own = kind == OWN
        own_adv, res_adv = group_insert_advantages(rewards[own], groups[own], groups[~own],
                                                   norm_by_std=self.a.norm_adv_by_std, epsilon=self.a.epsilon)
        adv = torch.zeros(len(rows))
        adv[own], adv[~own] = own_adv, res_adv
        return StepAdvantages(adv, torch.ones(len(rows)))

    @override
    def on_policy_rows(self, kind: torch.Tensor) -> torch.Tensor:
        return kind == RESCUE  # inserted rescues: ratio 1

    @override
    def rescue_loss(self, model, rescues: list[RescueItem], minibatch_index: int,
                    pad_id: int) -> tuple[torch.Tensor | None, dict]:
        if minibatch_index != 0 or not rescues or self.sh.sgt.variant != "nll":
            return None, {}
        r_logp, r_mask = sequence_logprobs(model, [x.prompt_token_ids for x in rescues], [x.token_ids for x in rescues],
                                           pad_id=pad_id)
        g = self.sh.sgt
        nll = sgt_nll(r_logp, r_mask, sgt_token_weights(r_logp, g.guard, g.luffy_gamma) if g.guard != "none" else None)
        return g.weight * nll, {"sgt_nll": nll.detach()}
