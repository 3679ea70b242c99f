"""GSPO: sequence-level importance ratio (docs/algorithms.md §1.2).

GSPO replaces GRPO's per-token ratio by the length-normalised sequence ratio
``s_i = exp((1/|y_i|) Σ_t (log π_θ − log π_old))``, which matches the unit of
the reward (one per sequence) and is far less noisy for long completions.
"""

from __future__ import annotations

import torch

from mutualrl.grpo.aggregation import agg_loss, row_mean
from mutualrl.grpo.policy_loss import POLICY_LOSSES, PolicyLossOutput, masked_extreme, masked_mean

MAX_SEQ_LOG_RATIO = 10.0
"""verl clamps the sequence log-ratio at 10 before exponentiating (§1.2)."""


def sequence_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(1/|y_i|) Σ_t x_{i,t}`` over the masked tokens of each row: [B, T] -> [B] (0 for empty rows)."""
    m = mask.to(x.dtype)
    return (x * m).sum(-1) / m.sum(-1).clamp(min=1.0)


def sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``s_i = exp(clamp(ℓ̄_θ(y_i) − ℓ̄_old(y_i), ±10))`` (§1.2), differentiable through ``logp``. [B]"""
    return sequence_mean(logp - old_logp, mask).clamp(-MAX_SEQ_LOG_RATIO, MAX_SEQ_LOG_RATIO).exp()


def _ratio_metrics(ratio: torch.Tensor, clipped: torch.Tensor, rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """Sequence-ratio diagnostics over the rows with tokens (0-dim tensors; 0 / 1 when none)."""
    return {
        "clip_frac": masked_mean(clipped.float(), rows),
        "ratio_mean": masked_mean(ratio, rows, empty=1.0),
        "ratio_max": masked_extreme(ratio, rows, largest=True, empty=1.0),
        "ratio_min": masked_extreme(ratio, rows, largest=False, empty=1.0),
    }


@POLICY_LOSSES.register("gspo")
def gspo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              clip_low: float = 3e-4, clip_high: float = 4e-4, clip_ratio_c: float | None = None,
              loss_agg: str = "seq-mean-token-mean", norm_len: float | None = None) -> PolicyLossOutput:
    """GSPO objective ``−(1/G) Σ_i min(s_i Â_i, clip(s_i, 1−ε_l, 1+ε_h) Â_i)`` (§1.2).

    Gradient (unclipped rows): ``−s_i Â_i (1/|y_i|) Σ_t ∇log π_θ(y_{i,t})``.
    logp, old_logp [B, T]; advantages [B] (one per sequence); mask [B, T].
    Rows with an empty mask are excluded from the mean. ``loss_agg``, ``norm_len`` and
    ``clip_ratio_c`` are accepted for a uniform signature and ignored: GSPO is a
    sequence mean of sequence objectives and has no dual clip.
    """
    if advantages.dim() != 1:
        raise ValueError("gspo takes one advantage per sequence ([B]); use gspo_token for per-token advantages")
    rows = mask.sum(-1) > 0  # [B]
    s = sequence_ratio(logp, old_logp, mask)  # [B]
    obj1 = s * advantages  # [B]
    obj2 = s.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages  # [B]
    per_seq = -torch.minimum(obj1, obj2)  # [B]
    loss = row_mean(per_seq, rows)  # no rows: 0, with a zero gradient
    with torch.no_grad():
        metrics = _ratio_metrics(s, obj2 < obj1, rows)
        metrics["approx_kl"] = masked_mean(old_logp - logp, mask)
    return PolicyLossOutput(loss, metrics)


@POLICY_LOSSES.register("gspo_token")
def gspo_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                    clip_low: float = 3e-4, clip_high: float = 4e-4, clip_ratio_c: float | None = None,
                    loss_agg: str = "seq-mean-token-mean", norm_len: float | None = None) -> PolicyLossOutput:
    """GSPO-token: ``s_{i,t} = sg[s_i] · π_θ(y_{i,t}) / sg[π_θ(y_{i,t})]`` (§1.2).

    Numerically ``s_{i,t} = s_i``; its gradient is that of token t alone, so a
    per-token advantage ``Â_{i,t}`` may be used. With one advantage per sequence and
    ``seq-mean-token-mean`` it equals GSPO in value and gradient (verl's implementation).
    advantages [B] or [B, T]; ``clip_ratio_c`` is ignored (no dual clip in GSPO).
    """
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # [B, 1|T]
    s = sequence_ratio(logp, old_logp, mask)  # [B]
    # where the sequence log-ratio is clamped at ±10 GSPO has no gradient; so neither may the
    # token form (the clamp sits inside the detached factor, so it must be applied here)
    raw = sequence_mean(logp.detach() - old_logp, mask)  # [B]
    inside = (raw.abs() <= MAX_SEQ_LOG_RATIO).to(logp.dtype)[:, None]  # [B, 1]
    s_tok = s.detach()[:, None] * ((logp - logp.detach()) * inside).exp()  # [B, T], value s_i, grad of token t
    obj1 = s_tok * adv
    obj2 = s_tok.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    per_tok = -torch.minimum(obj1, obj2)  # [B, T]
    loss = agg_loss(per_tok, mask, loss_agg, norm_len)
    with torch.no_grad():
        rows = mask.sum(-1) > 0
        metrics = {
            **_ratio_metrics(s, torch.zeros_like(rows), rows),
            "clip_frac": masked_mean((obj2 < obj1).float(), mask),
            "approx_kl": masked_mean(old_logp - logp, mask),
        }
    return PolicyLossOutput(loss, metrics)
