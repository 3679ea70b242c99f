"""XGRPO: peer-informed group baselines from shared ``AdvantageStats`` (docs/algorithms.md §3.3).

The learner trains only on its own rollouts (on-policy support is kept); peers
contribute scalars — their group's count, mean and std for the same prompt —
to the baseline ``b̃`` and scale ``σ̃``. An all-fail own group then gets
``Â < 0`` when peers succeed on the prompt, where GRPO gives 0.

Everything is computed from sufficient statistics (count, Σr, Σr²), so one
formula serves every variant and a single-policy group reduces exactly to
GRPO (§1.1): mean and unbiased (N−1) std.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mutualrl.grpo.groups import group_index, group_sum

XGRPO_VARIANTS = ("pooled", "calibrated", "leave_self_out")


def _own_sums(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row count, Σr and Σr² of the row's own group. [B] each."""
    inverse, K = group_index(group_ids)
    r = rewards.double()
    n = group_sum(torch.ones_like(r), inverse, K)
    s1 = group_sum(r, inverse, K)
    s2 = group_sum(r * r, inverse, K)
    return n[inverse], s1[inverse], s2[inverse]


@dataclass(frozen=True)
class PeerGroupStats:
    """What M peers reported for each row's prompt (§3.3): sample count, mean and unbiased (N−1) std,
    all [B, M] (count 0 = that peer sent nothing for it); ``omega`` [B, M], the capability ratios
    ``ω^(n,m) = P̂_n/P̂_m`` that only the calibrated variant reads."""

    count: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    omega: torch.Tensor | None = None


def xgrpo_baseline(
    rewards: torch.Tensor, group_ids: torch.Tensor, peers: PeerGroupStats, *,
    variant: str = "pooled",
    peer_weight: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Baseline ``b̃`` and scale ``σ̃`` per row (§3.3 XGRPO).

    rewards [B], group_ids [B]: the learner's own rollouts; peers: the M peers' stats per row.
    variant:
      pooled          ``b̃ = (G_n μ_n + λ Σ_m G_m μ_m) / (G_n + λ Σ_m G_m)``; ``σ̃`` the std of
                      the pooled samples (each peer sample weighted λ; exact sample std at λ=1).
      calibrated      as pooled with each peer's rewards scaled by ``ω^(n,m) = P̂_n/P̂_m``
                      (HACPO Eq. 7), so ``μ_m → ω μ_m`` and ``σ_m → ω σ_m`` (``peers.omega``).
      leave_self_out  as pooled, but row i's own group excludes row i itself, so ``b̃_i`` and
                      ``σ̃_i`` do not depend on ``r_i`` (the baseline is strictly unbiased).
    A pooled set of ≤ 1 sample has baseline 0 and scale 1 (GRPO's group-of-one convention).
    """
    if variant not in XGRPO_VARIANTS:
        raise ValueError(f"unknown xgrpo variant {variant!r}; valid: {', '.join(XGRPO_VARIANTS)}")
    if not (peers.count.shape == peers.mean.shape == peers.std.shape) or peers.count.shape[:1] != rewards.shape:
        raise ValueError(f"peer stats must all be [B, M] with B={rewards.shape[0]}; got {tuple(peers.count.shape)}, "
                         f"{tuple(peers.mean.shape)}, {tuple(peers.std.shape)}")
    n, s1, s2 = _own_sums(rewards, group_ids)  # [B]
    if variant == "leave_self_out":
        r = rewards.double()
        n, s1, s2 = n - 1, s1 - r, s2 - r * r
    c = peers.count.double()  # [B, M]
    mu = peers.mean.double()
    sd = peers.std.double()
    if variant == "calibrated":
        if peers.omega is None:
            raise ValueError("the calibrated variant needs peers.omega (capability ratios P̂_n/P̂_m)")
        omega = peers.omega.double().expand_as(mu)
        mu, sd = mu * omega, sd * omega
    lam = float(peer_weight)
    n_p = lam * c.sum(-1)  # [B]
    p1 = lam * (c * mu).sum(-1)
    p2 = lam * ((c - 1).clamp(min=0) * sd * sd + c * mu * mu).sum(-1)
    N = n + n_p
    many = N > 1
    safe_N = torch.where(many, N, torch.ones_like(N))
    base = (s1 + p1) / safe_N
    var = ((s2 + p2 - safe_N * base * base) / (safe_N - 1).clamp(min=1e-12)).clamp(min=0.0)
    base = torch.where(many, base, torch.zeros_like(base))
    scale = torch.where(many, var.sqrt(), torch.ones_like(var))
    return base.to(rewards.dtype if rewards.is_floating_point() else torch.float32), scale.to(torch.float32)


def xgrpo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, peers: PeerGroupStats, *,
    variant: str = "pooled",
    peer_weight: float = 1.0,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``Â_i = (r_i − b̃)/(σ̃ + ε)`` (§3.3; ``norm_by_std=False``: ``r_i − b̃``).

    Returns (advantages [B], baseline [B], scale [B]); see :func:`xgrpo_baseline`.
    """
    base, scale = xgrpo_baseline(rewards, group_ids, peers, variant=variant, peer_weight=peer_weight)
    adv = rewards.float() - base.float()
    return (adv / (scale + epsilon) if norm_by_std else adv), base, scale
