"""``xgrpo``: own rollouts only; each group's baseline and scale pool the peers' AdvantageStats (docs/algorithms.md §3.3
XGRPO)."""

from __future__ import annotations

import torch
from typing_extensions import override

from mutualrl.config import SharingConfig
from mutualrl.grpo import PeerGroupStats, RescueItem, xgrpo_advantages
from mutualrl.services.learner.modes.base import SharingMode, group_ids, register_mode
from mutualrl.services.learner.objective import Rows, StepAdvantages
from mutualrl.services.learner.peer_experience import IntakeResult, PeerStats


def stats_outcomes(stats: dict[str, list[PeerStats]]) -> dict[str, list[float]]:
    """Each producer's 0/1 outcomes as its AdvantageStats summarise them (count and success
    rate per group): what the capability tracker (§2.2) takes for a peer whose rows it never sees."""
    out: dict[str, list[float]] = {}
    for per_prompt in stats.values():
        for st in per_prompt:
            wins = round(st.success_rate * st.count)
            out.setdefault(st.producer, []).extend([1.0] * wins + [0.0] * (st.count - wins))
    return out


@register_mode
class CrossGroupAdvantages(SharingMode):
    """Own rows; the baseline and scale come from peers' statistics (settings: ``sharing.xgrpo``);
    the ``calibrated`` variant weighs each peer by ω = P̂_self / P̂_peer."""

    name = "xgrpo"
    section = "§3.3 XGRPO"
    peer_kinds = ("advantage_stats",)

    @staticmethod
    @override
    def needs_tracker(sharing: SharingConfig) -> bool:
        return sharing.xgrpo.variant == "calibrated"

    @override
    def observe(self, own_rewards: list[float], intake: IntakeResult) -> None:
        if self.tracker is not None:
            self.tracker.update({self.policy: own_rewards, **intake.peer_rewards, **stats_outcomes(intake.stats)})

    @override
    def shared_in(self, peer_rows: int, rescues: list[RescueItem], stats: dict[str, list[PeerStats]]) -> int:
        return peer_rows + len(rescues) + sum(len(v) for v in stats.values())

    def advantages(self, rows: Rows, peer_stats: dict[str, list[PeerStats]]) -> StepAdvantages:
        """Per-prompt [K, M] stat tables filled from the messages, then gathered per row."""
        rewards = torch.tensor(rows.reward)
        groups, gid = group_ids(rows)
        peers = sorted({s.producer for st in peer_stats.values() for s in st})
        col = {p: j for j, p in enumerate(peers)}
        K, M = len(gid), max(1, len(peers))
        # (count, mean, std); filled in Python, one tensor after
        table = [[[0.0, 0.0, 0.0] for _ in range(M)] for _ in range(K)]
        for pid, stats in peer_stats.items():
            k = gid.get(pid)
            if k is None:
                continue
            for st in stats:
                table[k][col[st.producer]] = [float(st.count), st.mean, st.std]
        t = torch.tensor(table)  # [K, M, 3]
        count, mean, std = t[..., 0], t[..., 1], t[..., 2]
        omega = torch.ones(M)
        if self.tracker is not None:
            for p, j in col.items():
                omega[j] = self.tracker.ratio(self.policy, p)  # ω^(n,m) = P̂_n / P̂_m
        x = self.sh.xgrpo
        peer_stats = PeerGroupStats(count[groups], mean[groups], std[groups], omega.expand(len(rows), M))  # [B, M]
        adv, base, _ = xgrpo_advantages(rewards, groups, peer_stats, variant=x.variant, peer_weight=x.peer_weight,
                                        norm_by_std=self.a.norm_adv_by_std, epsilon=self.a.epsilon)
        return StepAdvantages(adv, torch.ones(len(rows)),
                              {"xgrpo_baseline_mean": float(base.mean()) if len(rows) else 0.0})
