"""Decoupled PPO for stale rollouts (docs/algorithms.md §6).

A rollout sampled k versions ago comes from a behaviour policy π_b that is no longer the learner's.
The decoupled objective (AReaL) separates the two roles π_old played in §1.1:

- the *proximal* policy π_prox — the learner's weights at the start of the step, recomputed on the
  row's tokens — is what the clipped ratio ``r_θ = π_θ/π_prox`` is anchored to, so the trust region is
  around where the learner is, not where the sampler was;
- the *behaviour* policy π_b — the sampler's log-probs — enters only through a detached importance
  weight ``w = π_prox/π_b``, truncated at ``is_cap`` (our choice, as truncated IS does), that corrects
  for the rows having been drawn from π_b.

``L = −w · min(r_θ Â, clip(r_θ, 1−ε_low, 1+ε_high) Â)``. Because ``w ≥ 0`` is detached,
``w · min(r_θ Â, clip(r_θ) Â) = min(r_θ (wÂ), clip(r_θ) (wÂ))`` and the dual clip scales alike, so the
objective is any registered policy loss with ``old := π_prox`` and advantages ``w Â``: one formula
serves the token losses and, with the length-normalised sequence weight, GSPO. When π_prox = π_b
(no lag) ``w = 1`` and the loss is the plain clipped objective exactly.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from mutualrl.grpo.gspo import sequence_mean
from mutualrl.grpo.policy_loss import PolicyLossOutput, masked_mean

SEQUENCE_LEVEL_LOSSES = frozenset({"gspo"})
"""Registered policy losses that take one advantage per sequence: their behaviour weight is per sequence too."""


def behaviour_weights(prox_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor,
                      cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``w = min(π_prox/π_b, cap)`` (detached) [B, T], and the fraction of masked tokens truncated
    (a 0-dim tensor)."""
    log_w = (prox_logp - behav_logp).detach()  # [B, T]
    truncated = log_w > math.log(cap)  # [B, T]
    w = log_w.clamp(max=math.log(cap)).exp()
    return w, masked_mean(truncated.float(), mask)


def sequence_behaviour_weights(prox_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor,
                               cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence ``w_i = min(exp(ℓ̄_prox(y_i) − ℓ̄_b(y_i)), cap)`` [B] — GSPO's length-normalised ratio in place
    of the token one — and the fraction of rows (with tokens) truncated."""
    log_w = sequence_mean((prox_logp - behav_logp).detach(), mask)  # [B]
    rows = mask.sum(-1) > 0
    truncated = log_w > math.log(cap)
    return log_w.clamp(max=math.log(cap)).exp(), masked_mean(truncated.float(), rows)


def decoupled_policy_loss(
    base: Callable[..., PolicyLossOutput],
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    is_cap: float = 2.0,
    sequence_level: bool = False,
    **base_kwargs,
) -> PolicyLossOutput:
    """The decoupled objective (§6) through ``base``, a registered policy loss.

    logp [B, T] the learner's log-probs (with gradient); prox_logp [B, T] the learner's at the start of the
    step (no gradient); behav_logp [B, T] the sampler's; advantages [B] (or [B, T] for a token loss);
    mask [B, T]. ``sequence_level``: ``base`` takes one advantage per sequence (GSPO). ``base_kwargs`` go to
    ``base`` (clip bounds, aggregation). Adds ``is_weight_mean`` (mean w over masked tokens, or rows) and
    ``is_truncated_frac`` to the base loss's metrics.
    """
    if is_cap <= 1.0:
        raise ValueError(f"is_cap must be > 1 (a weight of 1 is no lag); got {is_cap}")
    prox = prox_logp.detach()
    if sequence_level:
        w, truncated = sequence_behaviour_weights(prox, behav_logp, mask, is_cap)  # [B]
        if advantages.dim() != 1:
            raise ValueError("a sequence-level loss takes one advantage per sequence ([B])")
        weighted = advantages * w  # [B]
        w_mean = masked_mean(w, mask.sum(-1) > 0, empty=1.0)
    else:
        w, truncated = behaviour_weights(prox, behav_logp, mask, is_cap)  # [B, T]
        adv = advantages[:, None] if advantages.dim() == 1 else advantages  # [B, 1|T]
        weighted = adv * w  # [B, T]
        w_mean = masked_mean(w, mask, empty=1.0)
    out = base(logp, prox, weighted, mask, **base_kwargs)
    out.metrics["is_weight_mean"] = w_mean
    out.metrics["is_truncated_frac"] = truncated
    return out
