"""PRP: peer rollouts pooled into the learner's group with truncated density ratios (docs/algorithms.md §3.3).

Own rows keep the base PPO/GSPO objective; peer rows (already retokenised by
THL) enter with an importance weight against the peer's behaviour policy:
sequence level ``w = exp(ℓ̄_n − ℓ̄_m)`` (the default: robust to THL, because
each mean is taken in its own tokenisation) or token level
``w_t = exp(ℓ_{n,t} − ℓ̃^(m)_t)`` with THL-transported ``ℓ̃``. The weight is
truncated at C (TIS): the estimator is ``E_{π_m}[min(w, C)·Â·∇log π_n]``,
i.e. the gradient keeps its direction and its size is bounded, trading the
variance ``∝ E[w²]`` of §3.4 for bias.
"""

from __future__ import annotations

import torch

from mutualrl.grpo.aggregation import agg_loss, row_mean
from mutualrl.grpo.gspo import MAX_SEQ_LOG_RATIO, sequence_mean
from mutualrl.grpo.policy_loss import PolicyLossOutput, masked_extreme, masked_mean

PRP_RATIO_LEVELS = ("sequence", "token")


def _truncated(w: torch.Tensor, cap: float) -> torch.Tensor:
    """Value ``min(w, C)``, gradient ``min(w, C)·∇log w`` (the truncated-IS score-function estimator)."""
    return (w.clamp(max=cap) / w).detach() * w


def prp_peer_loss(
    logp: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    peer_logp: torch.Tensor | None = None,
    peer_mean_logp: torch.Tensor | None = None,
    level: str = "sequence",
    truncation: float = 1.0,
    loss_agg: str = "token-mean",
    norm_len: float | None = None,
) -> PolicyLossOutput:
    """Loss of the peer rows of a pooled group (§3.3 PRP).

    logp [P, T]: the learner's log-probs of the retokenised peer completions; mask [P, T]
    (THL's aligned-token mask for token level); advantages [P] from the pooled group.
    sequence level needs ``peer_mean_logp`` [P] (ℓ̄_m in the peer's tokenisation);
    token level needs ``peer_logp`` [P, T] (ℓ̃^(m) transported onto the learner's tokens).
    sequence: ``loss = −mean_i min(w_i, C)·Â_i`` with gradient ``min(w,C)·Â·∇ℓ̄_n``;
    token:    ``loss = agg_t(−min(w_t, C)·Â_i)`` with the run's aggregation mode.
    """
    if level not in PRP_RATIO_LEVELS:
        raise ValueError(f"unknown PRP ratio level {level!r}; valid: {', '.join(PRP_RATIO_LEVELS)}")
    if truncation <= 0:
        raise ValueError("PRP truncation C must be > 0")
    if level == "sequence":
        if peer_mean_logp is None:
            raise ValueError("sequence-level PRP needs peer_mean_logp")
        rows = mask.sum(-1) > 0
        w = (sequence_mean(logp, mask) - peer_mean_logp).clamp(-MAX_SEQ_LOG_RATIO, MAX_SEQ_LOG_RATIO).exp()  # [P]
        obj = _truncated(w, truncation) * advantages
        loss = -row_mean(obj, rows)  # no rows: 0, with a zero gradient
        with torch.no_grad():
            metrics = {
                "peer_weight_mean": masked_mean(w, rows, empty=float("nan")),
                "peer_weight_max": masked_extreme(w, rows, largest=True, empty=float("nan")),
                "peer_truncated_frac": masked_mean((w > truncation).float(), rows),
            }
        return PolicyLossOutput(loss, metrics)
    if peer_logp is None:
        raise ValueError("token-level PRP needs peer_logp")
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    w = (logp - peer_logp).clamp(-20.0, 20.0).exp()  # [P, T]
    per_tok = -_truncated(w, truncation) * adv
    loss = agg_loss(per_tok, mask, loss_agg, norm_len)
    with torch.no_grad():
        metrics = {
            "peer_weight_mean": masked_mean(w, mask),
            "peer_weight_max": masked_extreme(w, mask, largest=True, empty=float("nan")),
            "peer_truncated_frac": masked_mean((w > truncation).float(), mask),
        }
    return PolicyLossOutput(loss, metrics)
