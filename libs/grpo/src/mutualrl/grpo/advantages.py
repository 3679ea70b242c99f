"""Group-relative advantages (docs/algorithms.md §1.1)."""

from __future__ import annotations

import torch

from mutualrl.grpo.groups import group_index, group_sum


def group_stats(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row group mean, std (unbiased, N-1) and size.

    rewards   [B]  scalar reward per completion
    group_ids [B]  integer id of each row's prompt group (any labels)
    returns   mean [B], std [B], count [B], broadcast back to rows.
    A group of one has mean 0 and std 1 (verl's convention), so its advantage is the raw reward.
    """
    inverse, K = group_index(group_ids)  # [B] -> 0..K-1
    r = rewards.float()
    count = group_sum(torch.ones_like(r), inverse, K)  # [K]
    mean = group_sum(r, inverse, K) / count  # [K]
    sq = group_sum((r - mean[inverse]) ** 2, inverse, K)  # [K]
    std = torch.sqrt(sq / (count - 1).clamp(min=1))  # [K]
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[inverse], std[inverse], count[inverse]


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> torch.Tensor:
    """GRPO outcome advantage ``Â_i = (r_i − mean(r_G)) / (std(r_G) + ε)`` (§1.1).

    With ``norm_by_std=False`` this is Dr.GRPO's ``Â_i = r_i − mean(r_G)`` (§1.1, 2503.20783).
    rewards [B], group_ids [B] -> advantages [B] (one scalar per completion,
    broadcast over its tokens by the caller).
    """
    mean, std, _ = group_stats(rewards, group_ids)  # [B] each
    adv = rewards.float() - mean  # [B]
    return adv / (std + epsilon) if norm_by_std else adv

