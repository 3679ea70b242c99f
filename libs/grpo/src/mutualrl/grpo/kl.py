"""KL estimators against a reference policy (docs/algorithms.md §1.1, verl ``kl_penalty``)."""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3", "k3+")


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL estimate of π_θ from π_ref, elementwise over ``[B, T]``.

    k1: ``log π − log π_ref``; k2: ``½(log π − log π_ref)²``;
    k3 (low_var_kl): ``exp(log π_ref − log π) − (log π_ref − log π) − 1`` with the
    inner log-ratio clamped to ±20 and the value to [−10, 10];
    k3+: k3's value with k2's gradient (straight-through).
    """
    if kind == "k1":
        return logp - ref_logp
    if kind == "k2":
        return 0.5 * (logp - ref_logp) ** 2
    if kind in ("k3", "k3+"):
        log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)  # [B, T]
        k3 = (log_ratio.exp() - log_ratio - 1.0).clamp(-10.0, 10.0)  # [B, T]
        if kind == "k3":
            return k3
        k2 = 0.5 * (logp - ref_logp) ** 2
        return k2 + (k3 - k2).detach()
    raise ValueError(f"unknown KL estimator {kind!r}; valid: {', '.join(KL_ESTIMATORS)}")
