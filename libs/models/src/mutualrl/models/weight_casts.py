"""Mixed precision without keeping a 16-bit copy of every weight through the backward pass.

Under ``torch.autocast`` each fp32 weight is cast to bf16 before its matmul, and autograd saves that cast for
the backward pass (a linear layer's input gradient is ``grad @ W``). Autocast also caches the casts until its
context closes. So a forward pass holds a bf16 copy of every weight it used until the backward pass has gone
through it: 2 bytes a parameter, on top of the activations — 0.25 GiB for SmolLM2-135M, 1.2 GiB for a 0.6 B
model — at the moment activation memory peaks, the end of the forward (docs/algorithms.md §7.2).

The cast is cheap and its source does not change before the backward (the optimiser steps after it), so
:func:`learner_autocast` keeps a *reference to the fp32 weight* in its place and casts it again when the backward
needs it: the same bits, so the same gradients. It turns autocast's cache off as well (each weight is cast once
per forward in these models anyway; the tied embedding's two uses are a lookup, which autocast leaves in fp32,
and the head). A weight changed in place between the forward and the backward raises, as autograd does for
a saved tensor."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_CAST_NODE = "ToCopyBackward0"


def _cast_source(t: torch.Tensor) -> torch.Tensor | None:
    """The leaf (a parameter that requires grad) ``t`` is a cast of, or None: ``t``'s autograd node is a dtype copy
    whose only input accumulates into a leaf of the same shape."""
    fn = t.grad_fn
    if fn is None or type(fn).__name__ != _CAST_NODE or len(fn.next_functions) != 1:
        return None
    src = getattr(fn.next_functions[0][0], "variable", None)  # AccumulateGrad holds its leaf
    if not isinstance(src, torch.Tensor) or src.dtype == t.dtype or src.shape != t.shape:
        return None
    return src


class _Recast:
    """A saved cast of a leaf (or a view of one: a linear layer saves its weight's transpose), kept as the leaf, its
    version, the cast's dtype and the view's geometry."""
    __slots__ = ("source", "version", "dtype", "view")

    def __init__(self, source: torch.Tensor, dtype: torch.dtype, view: tuple | None):
        self.source, self.version, self.dtype, self.view = source, source._version, dtype, view

    def tensor(self) -> torch.Tensor:
        if self.source._version != self.version:
            raise RuntimeError("a weight was modified in place between the forward and the backward pass; its "
                               "16-bit cast is computed again for the backward and would not match the forward's")
        cast = self.source.detach().to(self.dtype, memory_format=torch.contiguous_format)
        return cast if self.view is None else cast.as_strided(*self.view)


def _pack(t: torch.Tensor):
    base = t._base if t._base is not None else t
    if base is not t and not base.is_contiguous():
        return t  # a view of a cast laid out otherwise: not rebuilt from a fresh (contiguous) cast
    src = _cast_source(base)
    if src is None:
        return t
    return _Recast(src, t.dtype, None if base is t else (t.size(), t.stride(), t.storage_offset()))


def _unpack(saved):
    return saved.tensor() if isinstance(saved, _Recast) else saved


@contextlib.contextmanager
def recast_saved_weights() -> Iterator[None]:
    """Within: casts of leaf tensors that autograd saves are kept as their fp32 leaves and cast again in the
    backward pass (module docstring). Other saved tensors are kept as they are."""
    with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
        yield


@contextlib.contextmanager
def learner_autocast(device: str | torch.device, dtype: torch.dtype) -> Iterator[None]:
    """A learner's mixed-precision forward: autocast to ``dtype`` on ``device`` without its cast cache, with
    weight casts recomputed for the backward instead of saved."""
    with torch.autocast(device_type=torch.device(device).type, dtype=dtype, cache_enabled=False), \
            recast_saved_weights():
        yield
