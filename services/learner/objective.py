"""Per-mode composition of the step objective from the pure functions of ``mutualrl.grpo``.

The learner hands over a step's training rows (own rollouts, peer rows,
rescue rows) and gets back (1) one advantage per row, computed once per step
over the whole batch, and (2) for each mini-batch, a differentiable loss with
detached diagnostics. Which formula applies to which row is decided here, per
``sharing.mode``; the formulas themselves live in ``libs/grpo``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mutualrl.config import AlgorithmConfig, SharingConfig
from mutualrl.grpo import (
    CapabilityTracker,
    PolicyLossOutput,
    agg_loss,
    get_policy_loss,
    group_insert_advantages,
    grpo_advantages,
    hacpo_advantages,
    hacpo_loss,
    kl_penalty,
    prp_peer_loss,
    xgrpo_advantages,
)
from mutualrl.services.learner.peer_experience import PeerStats

OWN, PEER, RESCUE = 0, 1, 2
"""Row kinds: the learner's own rollout, a peer's (THL-converted) rollout, an SGT rescue."""


@dataclass
class Rows:
    """A step's training rows in the order they are trained (own first, self-first for HACPO)."""

    prompt_ids: list[list[int]] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    old_logp: list[list[float]] = field(default_factory=list)  # behaviour log-probs on the learner's tokens
    mask: list[list[float]] = field(default_factory=list)  # tokens that enter the loss
    reward: list[float] = field(default_factory=list)
    prompt_id: list[str] = field(default_factory=list)
    source: list[str] = field(default_factory=list)  # producing policy
    kind: list[int] = field(default_factory=list)
    source_mean_logp: list[float] = field(default_factory=list)  # ℓ̄ of the behaviour policy in its own tokens

    def add(self, *, prompt_ids, completion_ids, old_logp, mask, reward, prompt_id, source, kind, source_mean_logp) -> None:
        if not (len(completion_ids) == len(old_logp) == len(mask)):
            raise ValueError(f"row of {len(completion_ids)} tokens has {len(old_logp)} log-probs and {len(mask)} mask entries")
        self.prompt_ids.append(list(prompt_ids))
        self.completion_ids.append(list(completion_ids))
        self.old_logp.append(list(old_logp))
        self.mask.append(list(mask))
        self.reward.append(float(reward))
        self.prompt_id.append(prompt_id)
        self.source.append(source)
        self.kind.append(kind)
        self.source_mean_logp.append(float(source_mean_logp))

    def __len__(self) -> int:
        return len(self.reward)

    def count(self, kind: int) -> int:
        return sum(1 for k in self.kind if k == kind)


@dataclass
class StepAdvantages:
    """The advantages of one step's rows, with the statistics the metrics report."""
    advantages: torch.Tensor  # [N]
    omega: torch.Tensor  # [N], HACPO's ω on cross rows (1 elsewhere)
    metrics: dict[str, float] = field(default_factory=dict)


def right_aligned(rows: list[list[float]], T: int) -> torch.Tensor:
    """Per-token lists into a [B, T] tensor aligned like ``sequence_logprobs`` (completion at the end)."""
    out = torch.zeros(len(rows), T)
    for i, r in enumerate(rows):
        if r:
            out[i, T - len(r) :] = torch.tensor(r, dtype=torch.float32)
    return out


class StepObjective:
    """The loss terms of one mini-batch (own rows, peer rows, rescues) before they are summed."""
    def __init__(self, policy: str, algorithm: AlgorithmConfig, sharing: SharingConfig, max_new_tokens: int, tracker: CapabilityTracker | None):
        self.policy = policy
        self.a = algorithm
        self.sh = sharing
        self.mode = sharing.mode
        self.norm_len = algorithm.loss_scale_factor or max_new_tokens
        self.tracker = tracker
        self.base = get_policy_loss(algorithm.loss)
        self.clip_low, self.clip_high = algorithm.clip_bounds()

    # ---- advantages, once per step ----------------------------------------
    def advantages(self, rows: Rows, peer_stats: dict[str, list[PeerStats]]) -> StepAdvantages:
        a = self.a
        N = len(rows)
        rewards = torch.tensor(rows.reward)
        gid: dict[str, int] = {}
        groups = torch.tensor([gid.setdefault(p, len(gid)) for p in rows.prompt_id])
        kind = torch.tensor(rows.kind)
        omega = torch.ones(N)
        metrics: dict[str, float] = {}
        if self.mode in ("none", "naive", "prp") or (self.mode == "sgt" and self.sh.sgt.variant == "nll"):
            # own rows only (none, sgt-nll) or the pooled group of own + peer rows (naive, prp)
            adv = grpo_advantages(rewards, groups, norm_by_std=a.norm_adv_by_std, epsilon=a.epsilon)
        elif self.mode == "sgt":  # group insert
            own = kind == OWN
            own_adv, res_adv = group_insert_advantages(rewards[own], groups[own], groups[~own], norm_by_std=a.norm_adv_by_std, epsilon=a.epsilon)
            adv = torch.zeros(N)
            adv[own], adv[~own] = own_adv, res_adv
        elif self.mode == "xgrpo":
            adv, base = self._xgrpo(rows, rewards, groups, gid, peer_stats)
            metrics["xgrpo_baseline_mean"] = float(base.mean()) if N else 0.0
        elif self.mode == "hacpo":
            assert self.tracker is not None
            ratio = {src: self.tracker.ratio(src, self.policy) for src in set(rows.source)}  # clip(P̂_src / P̂_k)
            omega = torch.tensor([1.0 if k == OWN else ratio[src] for k, src in zip(rows.kind, rows.source)])
            weight = 1.0 / omega  # ω^(k,src) = clip(P̂_k / P̂_src); 1 on own rows
            adv, base = hacpo_advantages(rewards, groups, weight, kind == OWN, epsilon=a.epsilon, binary_baseline_guard=self.sh.hacpo.binary_baseline_guard)
            metrics["hacpo_baseline_mean"] = float(base.mean()) if N else 0.0
            metrics["capability_self"] = self.tracker.capability(self.policy)
        else:
            raise ValueError(f"unknown sharing mode {self.mode!r}")
        return StepAdvantages(adv, omega, metrics)

    def _xgrpo(self, rows: Rows, rewards: torch.Tensor, groups: torch.Tensor, gid: dict[str, int], peer_stats: dict[str, list[PeerStats]]):
        """Per-prompt [K, M] stat tables filled from the messages, then gathered per row."""
        peers = sorted({s.producer for st in peer_stats.values() for s in st})
        col = {p: j for j, p in enumerate(peers)}
        K, M = len(gid), max(1, len(peers))
        table = [[[0.0, 0.0, 0.0] for _ in range(M)] for _ in range(K)]  # (count, mean, std); filled in Python, one tensor after
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
        adv, base, _ = xgrpo_advantages(
            rewards, groups, count[groups], mean[groups], std[groups], variant=x.variant, peer_weight=x.peer_weight,
            peer_omega=omega.expand(len(rows), M) if x.variant == "calibrated" else None, norm_by_std=self.a.norm_adv_by_std, epsilon=self.a.epsilon,
        )
        return adv, base

    # ---- loss, per mini-batch ---------------------------------------------
    def loss(
        self,
        *,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        mask: torch.Tensor,
        adv: torch.Tensor,
        kind: torch.Tensor,
        source_mean_logp: torch.Tensor,
        omega: torch.Tensor,
        minibatch_index: int,
        ref_logp: torch.Tensor | None,
    ) -> PolicyLossOutput:
        """Loss of one mini-batch. All tensors are the mini-batch's rows: [b, T] or [b]."""
        a = self.a
        if self.mode == "hacpo":
            h = self.sh.hacpo
            return hacpo_loss(
                logp, mask, source_mean_logp, adv, kind == OWN, omega,
                minibatch_index=minibatch_index, alpha=h.alpha, delta=h.delta, delta_step=h.delta_step,
                self_clip_low=h.self_clip_low, self_clip_high=h.self_clip_high, max_abs_log_ratio=h.max_abs_log_ratio,
                ref_logp=ref_logp, kl_coef=a.kl_coef, kl_type=a.kl_type, kl_agg=a.loss_agg, norm_len=self.norm_len,
            )
        own = kind == OWN
        # rows trained as if sampled by the learner itself, ratio := 1 (no IS):
        # naive's peer rows (the uncorrected baseline) and SGT's inserted rescues
        on_policy = (kind == PEER) if self.mode == "naive" else (kind == RESCUE) if self.mode == "sgt" else torch.zeros_like(own)
        base_rows = own | on_policy
        old = torch.where(on_policy[:, None], logp.detach(), old_logp)
        total = logp.sum() * 0.0
        metrics: dict[str, float] = {}
        if base_rows.any():
            pg = self.base(
                logp[base_rows], old[base_rows], adv[base_rows], mask[base_rows],
                clip_low=self.clip_low, clip_high=self.clip_high, clip_ratio_c=a.clip_ratio_c, loss_agg=a.loss_agg, norm_len=self.norm_len,
            )
            total = total + pg.loss
            metrics.update(pg.metrics)
        if self.mode == "prp" and (kind == PEER).any():
            peer = kind == PEER
            p = self.sh.prp
            out = prp_peer_loss(
                logp[peer], mask[peer], adv[peer], peer_logp=old_logp[peer], peer_mean_logp=source_mean_logp[peer],
                level=p.ratio_level, truncation=p.truncation, loss_agg=a.loss_agg, norm_len=self.norm_len,
            )
            total = total + p.weight * out.loss
            metrics.update(out.metrics)
        if a.kl_coef > 0 and ref_logp is not None and own.any():
            kl = agg_loss(kl_penalty(logp[own], ref_logp[own], a.kl_type), mask[own], a.loss_agg, norm_len=self.norm_len)
            total = total + a.kl_coef * kl
            metrics["kl"] = float(kl.detach())
        return PolicyLossOutput(total, metrics)
