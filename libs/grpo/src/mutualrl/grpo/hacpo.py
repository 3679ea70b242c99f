"""HACPO: heterogeneous agent collaborative policy optimisation (docs/algorithms.md §2).

Pieces, each as specified in §2.2–§2.7 (the [CODE] conventions of HACRL-code
where the paper leaves a choice):

- :class:`CapabilityTracker` — windowed capability ``P̂`` per agent (Eq. 9).
- :func:`hacpo_advantages` — the capability-aware mixed baseline (Eqs. 6–8)
  with both guards of §2.3.
- :func:`hacpo_loss` — the full per-learner loss of §2.7: GSPO on self rows,
  exponential IS (Eqs. 11–12) with stepwise clipping (Eqs. 13–14) and the ω
  discrepancy coefficient (Eq. 10) on cross rows, KL on self tokens only.
"""

from __future__ import annotations

from collections import deque
from typing import Mapping, Sequence

import torch

from mutualrl.grpo.aggregation import agg_loss, row_mean
from mutualrl.grpo.groups import group_index, group_sum
from mutualrl.grpo.gspo import sequence_mean
from mutualrl.grpo.kl import kl_penalty
from mutualrl.grpo.policy_loss import PolicyLossOutput, masked_mean

CAPABILITY_METRICS = ("positive_rate", "reward_mean")


class CapabilityTracker:
    """``P̂^(k)_t = (1/K) Σ_{τ=t−K+1..t} P^(k)_τ`` (Eq. 9), the window including the current batch.

    ``P^(k)_τ`` is agent k's positive rate (fraction of rewards > 0) or mean reward
    in batch τ. Before any history an agent's capability is 1.0; each batch's value is
    floored at ``minimum`` (so a batch of negative mean reward cannot cancel a good one). Update once per step with
    **every** agent's rewards before any
    learner uses the ratios (§2.2). State is plain data so checkpoints can carry it.
    """

    def __init__(
        self,
        window: int = 5,
        metric: str = "positive_rate",
        minimum: float = 1e-8,
        ratio_min: float = 0.1,
        ratio_max: float = 10.0,
        warmup_steps: int = 0,
    ):
        if metric not in CAPABILITY_METRICS:
            raise ValueError(f"unknown capability metric {metric!r}; valid: {', '.join(CAPABILITY_METRICS)}")
        if window < 1:
            raise ValueError("capability window must be >= 1")
        if not 0 < ratio_min <= 1 <= ratio_max:
            raise ValueError(f"need 0 < ratio_min <= 1 <= ratio_max; got [{ratio_min}, {ratio_max}]")
        self.window, self.metric, self.minimum = window, metric, minimum
        self.ratio_min, self.ratio_max, self.warmup_steps = ratio_min, ratio_max, warmup_steps
        self.steps = 0
        self._history: dict[str, deque[float]] = {}

    def batch_value(self, rewards: Sequence[float]) -> float:
        """One batch's capability value: the share of positive rewards, or their mean (``metric``)."""
        if not rewards:
            raise ValueError("capability update with no rewards")
        if self.metric == "positive_rate":
            return sum(1.0 for r in rewards if r > 0) / len(rewards)
        return sum(rewards) / len(rewards)

    def update(self, rewards: Mapping[str, Sequence[float]]) -> None:
        """One step: each agent's rewards of this batch (agents with none keep their window)."""
        for agent, rs in rewards.items():
            if rs:
                self._history.setdefault(agent,
                                         deque(maxlen=self.window)).append(max(self.minimum, self.batch_value(rs)))
        self.steps += 1

    def capability(self, agent: str) -> float:
        """P̂ of ``agent``: the mean of its window, at least ``minimum`` (1.0 before any batch)."""
        h = self._history.get(agent)
        if not h:
            return 1.0
        return max(self.minimum, sum(h) / len(h))

    def ratio(self, source: str, target: str) -> float:
        """``clip(P̂_src / P̂_tgt, ratio_min, ratio_max)``; 1.0 while ``steps <= warmup_steps``."""
        if self.steps <= self.warmup_steps:
            return 1.0
        raw = self.capability(source) / self.capability(target)
        return min(self.ratio_max, max(self.ratio_min, raw))

    def state_dict(self) -> dict:
        """The tracker's steps and windows, for a checkpoint."""
        return {"steps": self.steps, "history": {k: list(v) for k, v in self._history.items()}}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.steps = int(state["steps"])
        self._history = {k: deque((float(x) for x in v), maxlen=self.window) for k, v in state["history"].items()}


def hacpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    source_weight: torch.Tensor,
    is_self: torch.Tensor,
    *,
    epsilon: float = 1e-6,
    binary_baseline_guard: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Capability-aware advantage of every row of learner k's joint group (Eqs. 6–8, §2.3).

    ``μ̂^(k) = mean_i(ω^(k,src_i) · r_i)`` over the prompt's joint group (own and
    peers' rows), ``A_i = (r_i − μ̂^(k)) / (std(joint rewards, N−1) + ε)``.

    rewards [B]; group_ids [B] (prompt of each row); is_self [B] bool;
    source_weight [B] = ``ω^(k,src) = clip(P̂_k / P̂_src, 0.1, 10)`` (1 on self rows).
    Guards (§2.3 [CODE]): (a) all rewards of a joint group identical → plain mean,
    so A = 0; (b) ``binary_baseline_guard``: weighted baseline > 1 → the learner's
    own-sample mean for that group.
    Returns (advantages [B], baseline [B]).
    """
    inv, K = group_index(group_ids)  # [B] -> 0..K-1
    r = rewards.double()
    w = source_weight.double()
    own = is_self.double()
    n = group_sum(torch.ones_like(r), inv, K)  # [K]
    mean = group_sum(r, inv, K) / n
    weighted = group_sum(r * w, inv, K) / n
    sq = group_sum((r - mean[inv]) ** 2, inv, K)
    std = torch.sqrt(sq / (n - 1).clamp(min=1))
    r_min = torch.full((K,), float("inf"), dtype=torch.float64).scatter_reduce(0, inv, r, "amin")
    r_max = torch.full((K,), float("-inf"), dtype=torch.float64).scatter_reduce(0, inv, r, "amax")
    identical = r_min == r_max
    n_own = group_sum(own, inv, K)
    own_mean = group_sum(r * own, inv, K) / n_own.clamp(min=1)
    base = torch.where(identical, mean, weighted)  # guard (a)
    if binary_baseline_guard:
        base = torch.where((base > 1.0) & (n_own > 0), own_mean, base)  # guard (b)
    adv = (r - base[inv]) / (std[inv] + epsilon)
    adv = torch.where(identical[inv], torch.zeros_like(adv), adv)
    return adv.float(), base[inv].float()


def cross_clip_lower(minibatch_index: int, delta: float, delta_step: float) -> float:
    """Stepwise clipping lower bound ``min(1, 1 − δ + m·δ_step)`` (Eqs. 13–14, §2.6)."""
    return min(1.0, 1.0 - delta + minibatch_index * delta_step)


def hacpo_loss(
    logp: torch.Tensor,
    mask: torch.Tensor,
    source_mean_logp: torch.Tensor,
    advantages: torch.Tensor,
    is_self: torch.Tensor,
    omega: torch.Tensor,
    *,
    minibatch_index: int = 0,
    alpha: float = 1.0,
    delta: float = 0.2,
    delta_step: float = 0.025,
    self_clip_low: float = 3e-4,
    self_clip_high: float = 4e-4,
    max_abs_log_ratio: float = 10.0,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_type: str = "k3",
    kl_agg: str = "seq-mean-token-mean",
    norm_len: float | None = None,
) -> PolicyLossOutput:
    """The per-learner HACPO loss of §2.7, for one mini-batch.

    logp [B, T]: learner k's log-probs of each row (cross rows retokenised with T_k); mask [B, T].
    source_mean_logp [B]: ``ℓ̄_src`` — the behaviour mean log-prob in the source's own
    tokenisation (self rows: the rollout's; cross rows: the peer's, EOS excluded).
    advantages [B] from :func:`hacpo_advantages`; is_self [B] bool;
    omega [B] = ``clip(P̂_src/P̂_k, 0.1, 10)`` on cross rows (Eq. 10; ignored on self rows).

    ``s = exp(clamp(ℓ̄_k − ℓ̄_src, ±10))``;
    self:  ``o = min(s·A, clip(s, 1−ε_l, 1+ε_h)·A)`` (GSPO);
    cross: ``c = clamp(s, min(1, 1−δ+m·δ_step), 1)``, ``o = c·sg[c]^α·ω·A`` — gradient
    ``ω·sg[c]^(α+1)·A·∇ℓ̄_k`` inside the bounds and exactly 0 below the lower bound (hard clamp);
    ``loss = −mean_rows(o) + kl_coef·agg(KL(log π_k, log π_ref) on self tokens only)``.
    """
    is_self = is_self.bool()
    rows = mask.sum(-1) > 0
    mean_lp = sequence_mean(logp, mask)  # [B], differentiable
    s = (mean_lp - source_mean_logp).clamp(-max_abs_log_ratio, max_abs_log_ratio).exp()  # [B]
    self_obj = torch.minimum(s * advantages, s.clamp(1.0 - self_clip_low, 1.0 + self_clip_high) * advantages)
    lower = cross_clip_lower(minibatch_index, delta, delta_step)
    c = s.clamp(lower, 1.0)
    cross_obj = c * c.detach().pow(alpha) * omega * advantages
    obj = torch.where(is_self, self_obj, cross_obj)  # [B]
    loss = -row_mean(obj, rows)  # no rows: 0, with a zero gradient
    kl_value: torch.Tensor | float = 0.0
    self_mask = mask * is_self[:, None].to(mask.dtype)
    if kl_coef > 0 and ref_logp is not None:  # no self tokens: agg_loss is 0 with a zero gradient
        kl = agg_loss(kl_penalty(logp, ref_logp, kl_type), self_mask, kl_agg, norm_len)
        loss = loss + kl_coef * kl
        kl_value = kl.detach()
    with torch.no_grad():
        # every diagnostic stays a 0-dim tensor (NaN where its rows are absent): no host read here
        sel_self, sel_cross = is_self & rows, ~is_self & rows
        nan = float("nan")
        metrics = {
            "kl": kl_value,
            "self_ratio_mean": masked_mean(s, sel_self, empty=nan),
            "self_clip_frac": masked_mean(((s < 1 - self_clip_low) | (s > 1 + self_clip_high)).float(), sel_self,
                                          empty=nan),
            "cross_ratio_mean": masked_mean(s, sel_cross, empty=nan),
            "cross_discarded_frac": masked_mean((s < lower).float(), sel_cross, empty=nan),
            "cross_lower_bound": lower,
            "omega_mean": masked_mean(omega, sel_cross, empty=nan),
            "self_rows": sel_self.sum(),
            "cross_rows": sel_cross.sum(),
        }
    return PolicyLossOutput(loss, metrics)
