"""FSDP2 sharding of a policy over the ranks of a ``torch.distributed`` process group.

``fully_shard`` (torch's FSDP2) is applied to every transformer block and then to the whole
model, so parameters, gradients and optimiser state are split over the ranks (each holds 1/N)
and gathered block by block during forward and backward. This is what lets a learner whose
weights, gradients and AdamW moments do not fit one device train at all; it runs over gloo on
CPU (CI) and NCCL on GPUs, with bf16 compute and fp32 reduction when asked.

Every rank runs the same step on the same mini-batch (the learner's collectives must match),
so an N-rank learner computes exactly the 1-rank update — sharding buys memory, not throughput;
splitting rows across ranks needs every loss's normaliser reduced across them first.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a HF causal LM (Llama/Qwen2 ``model.layers``, GPT-2 ``transformer.h``)."""
    for path in ("model.layers", "transformer.h"):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return list(obj)
    raise ValueError(f"{type(model).__name__}: no transformer blocks found (model.layers or transformer.h)")


def shard_policy(model: nn.Module, mixed_precision: bool = False, activation_checkpointing: bool = False) -> nn.Module:
    """Shard ``model`` in place over the default process group; returns it.

    ``mixed_precision``: bf16 parameters in compute, fp32 gradient reduction (GPU).
    ``activation_checkpointing``: recompute each block's activations in backward (GPU memory)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not dist.is_initialized():
        raise RuntimeError("shard_policy needs torch.distributed initialised (init_ranks or torchrun)")
    kwargs = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                reduce_dtype=torch.float32)} if mixed_precision else {}
    if activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

        blocks = set(map(type, transformer_blocks(model)))
        apply_activation_checkpointing(model, check_fn=lambda m: type(m) in blocks)
    for block in transformer_blocks(model):
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model``'s parameters are FSDP2 shards (DTensors, which have ``full_tensor``)."""
    return any(hasattr(p, "full_tensor") for p in model.parameters())


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole (unsharded) state dict on every rank — a collective: every rank must call it."""
    out = {}
    for k, v in model.state_dict().items():
        full = v.full_tensor() if hasattr(v, "full_tensor") else v
        out[k] = full.detach().cpu()
    return out


def full_value(x: torch.Tensor) -> torch.Tensor:
    """The whole value of a tensor that may be a DTensor (a gradient norm under FSDP2), still on
    its device: reading it back to the host is the caller's (one) decision."""
    return x.full_tensor() if hasattr(x, "full_tensor") else x


def rank() -> int:
    """This process's rank in the learner's process group (0 when there is none)."""
    return dist.get_rank() if dist.is_initialized() else 0


@contextmanager
def init_ranks(rank_: int, world: int, port: int, backend: str = "gloo") -> Iterator[None]:
    """A process group on loopback for ``world`` ranks (tests, and a learner's own workers)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend, rank=rank_, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()
