"""Per-group sums over a flat batch of rows: what every group-relative estimator is made of
(docs/algorithms.md §1.1). Rows carry the id of their prompt group; sums are scattered into one
slot per distinct id and gathered back to the rows by the caller (``sums[inverse]``)."""

from __future__ import annotations

import torch


def group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``inverse [B]`` (each row's group as 0..K-1) and ``K``, the number of distinct groups."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(inverse.max()) + 1 if inverse.numel() else 0


def group_sum(values: torch.Tensor, inverse: torch.Tensor, K: int) -> torch.Tensor:
    """``[K]``: the sum of ``values [B]`` over each group's rows, in ``values``' dtype."""
    return torch.zeros(K, dtype=values.dtype).index_add_(0, inverse, values)
