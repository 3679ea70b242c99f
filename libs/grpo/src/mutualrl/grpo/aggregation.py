"""Loss aggregation over tokens and sequences (docs/algorithms.md §1.1; the modes verl names)."""

from __future__ import annotations

import torch

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def row_mean(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``mean(x[rows])`` without reading ``rows`` back to the host (0, with zero gradient, when no
    row is selected): the learner syncs device values once per step, not per mini-batch."""
    r = rows.to(x.dtype)
    return torch.where(rows, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum() / r.sum().clamp(min=1.0)


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
             norm_len: float | None = None) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar.

    token-mean: ``Σ_{i,t} L·m / Σ m`` (DAPO); seq-mean-token-mean: ``mean_i(Σ_t L·m / Σ_t m)``
    (original GRPO, GSPO); seq-mean-token-sum: ``mean_i Σ_t L·m`` over the rows with tokens;
    seq-mean-token-sum-norm: ``Σ L·m / (B · norm_len)`` (Dr.GRPO's constant normaliser; norm_len
    defaults to T). We divide by B · norm_len as TRL's ``dr_grpo`` does, not by norm_len alone as
    verl does: with B in the denominator the loss (and so the learning rate that suits it) does
    not grow with the number of rows per mini-batch, which differs between policies and modes.
    Rows with an empty mask contribute nothing and never divide by zero.
    """
    m = mask.to(loss_mat.dtype)
    if mode == "token-mean":
        return (loss_mat * m).sum() / m.sum().clamp(min=1.0)
    seq_sum = (loss_mat * m).sum(-1)  # [B]
    if mode == "seq-mean-token-mean":
        per_seq = seq_sum / m.sum(-1).clamp(min=1.0)  # [B]
        return row_mean(per_seq, m.sum(-1) > 0)
    if mode == "seq-mean-token-sum":
        return row_mean(seq_sum, m.sum(-1) > 0)
    if mode == "seq-mean-token-sum-norm":
        denom = float(norm_len if norm_len is not None else loss_mat.shape[-1])
        return seq_sum.sum() / (loss_mat.shape[0] * denom)
    raise ValueError(f"unknown loss_agg_mode {mode!r}; valid: {', '.join(LOSS_AGG_MODES)}")
