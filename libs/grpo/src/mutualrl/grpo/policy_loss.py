"""Policy-gradient losses (docs/algorithms.md §1.1 GRPO token-level PPO-clip)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mutualrl.grpo.aggregation import agg_loss
from mutualrl.grpo.registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss")


@dataclass
class PolicyLossOutput:
    """A policy loss with its detached diagnostics (clip fractions, ratios)."""
    loss: torch.Tensor  # scalar, differentiable
    # detached diagnostics: 0-dim tensors (read back once per step by the learner) or floats
    metrics: dict[str, torch.Tensor | float] = field(default_factory=dict)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, empty: float | None = None) -> torch.Tensor:
    """Mean of ``x`` over the masked entries, as a detached 0-dim tensor: 0 when none, or
    ``empty`` when given — chosen on the device, without reading the mask back to the host."""
    m = mask.to(x.dtype)
    value = ((x * m).sum() / m.sum().clamp(min=1.0)).detach()
    if empty is None:
        return value
    return torch.where(mask.bool().any(), value, torch.tensor(empty, dtype=value.dtype, device=value.device))


def masked_extreme(x: torch.Tensor, mask: torch.Tensor, largest: bool, empty: float) -> torch.Tensor:
    """Max (or min) of ``x`` over the masked entries, ``empty`` when none — a 0-dim tensor,
    computed without reading the mask back to the host."""
    fill = float("-inf") if largest else float("inf")
    if x.numel() == 0:
        return torch.tensor(empty, device=x.device)
    sel = x.detach().masked_fill(~mask.bool(), fill)
    v = sel.max() if largest else sel.min()
    return torch.where(mask.bool().any(), v, torch.tensor(empty, dtype=x.dtype, device=x.device))


@POLICY_LOSSES.register("grpo")
def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_ratio_c: float | None = 3.0,
    loss_agg: str = "token-mean",
    norm_len: float | None = None,
) -> PolicyLossOutput:
    """Token-level PPO-clip with asymmetric clip and dual-clip (§1.1).

    ``ρ = exp(clamp(log π_θ − log π_old, ±20))``;
    ``L = −min(ρÂ, clip(ρ, 1−ε_low, 1+ε_high)Â)``, and for ``Â < 0`` the dual clip
    caps the loss at ``−Â·c`` (verl ``clip_ratio_c``; ``None`` disables it).

    logp, old_logp [B, T]; advantages [B] or [B, T]; mask [B, T]; ``norm_len`` is
    seq-mean-token-sum-norm's constant (default T).
    """
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # [B, 1] or [B, T]
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)  # [B, T]
    ratio = log_ratio.exp()  # [B, T]
    pg1 = -adv * ratio  # [B, T]
    pg2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # [B, T]
    clipped = torch.maximum(pg1, pg2)  # [B, T]
    per_tok = clipped
    if clip_ratio_c is not None:
        pg3 = -adv * clip_ratio_c  # [B, 1|T]
        per_tok = torch.where(adv < 0, torch.minimum(clipped, pg3), clipped)  # [B, T]
    loss = agg_loss(per_tok, mask, loss_agg, norm_len)
    with torch.no_grad():
        metrics = {
            "clip_frac": masked_mean((pg2 > pg1).float(), mask),
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_max": masked_extreme(ratio, mask, largest=True, empty=1.0),
            "approx_kl": masked_mean(-log_ratio, mask),
        }
    return PolicyLossOutput(loss, metrics)


def get_policy_loss(name: str):
    """The policy loss registered under ``name`` (the error lists the valid names)."""
    return POLICY_LOSSES.get(name)
