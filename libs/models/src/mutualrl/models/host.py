"""Reading a step's device values back to the host in one transfer.

Every ``float(t)`` of a GPU tensor waits for the device to finish what is queued before it; a
learner that read each mini-batch's loss, gradient norm and diagnostics as they were produced
would stall the device several times per mini-batch. The learner keeps them as 0-dim tensors and
reads the whole step's worth at once (docs/architecture.md, "One training step").
"""

from __future__ import annotations

from typing import Any

import torch


def _leaves(tree: Any, out: list[torch.Tensor]) -> None:
    if isinstance(tree, torch.Tensor):
        out.append(tree)
    elif isinstance(tree, dict):
        for v in tree.values():
            _leaves(v, out)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            _leaves(v, out)


def _rebuild(tree: Any, values: list[float], at: list[int]) -> Any:
    if isinstance(tree, torch.Tensor):
        v = values[at[0]]
        at[0] += 1
        return v
    if isinstance(tree, dict):
        return {k: _rebuild(v, values, at) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_rebuild(v, values, at) for v in tree)
    return tree


def read_scalars(tree: Any) -> Any:
    """``tree`` (dicts, lists and tuples of 0-dim tensors and plain values) with every tensor
    replaced by its Python float, read from the device in a single transfer per device.
    Booleans and integers come back as floats; plain values pass through unchanged."""
    leaves: list[torch.Tensor] = []
    _leaves(tree, leaves)
    for t in leaves:
        if t.numel() != 1:
            raise ValueError(f"read_scalars takes 0-dim (one-element) tensors; got shape {tuple(t.shape)}")
    values: list[float] = [0.0] * len(leaves)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(leaves):
        by_device.setdefault(t.device, []).append(i)
    for device, idx in by_device.items():
        stacked = torch.stack([leaves[i].detach().reshape(()).to(torch.float64) for i in idx])
        for i, v in zip(idx, stacked.tolist()):
            values[i] = v
    return _rebuild(tree, values, [0])
