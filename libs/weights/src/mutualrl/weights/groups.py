"""The weight groups of the collective transport: which process group the learner broadcasts
into, for each kind of rollout engine (docs/engines.md §4).

Rank 0 is always the learner (it hosts the rendezvous); the engine's workers are ranks 1..N.
Each engine joins with its own recipe, so the learner must join with the same one:

- ``hf`` (our in-process engine): :func:`~mutualrl.weights.transport.weight_group`, a fresh group
  per version on the learner's store.
- ``sglang``: ``/init_weights_update_group`` makes every worker join torch's own TCP rendezvous
  and build the group with torch's group helper under the name ``weight_update_group``
  (:func:`named_torch_group` follows the same steps, so the two meet).
- ``vllm``: ``/init_weight_transfer_engine`` makes every worker join a vLLM
  ``StatelessProcessGroup`` with a PyNccl communicator; only vLLM's own classes speak that, so
  :class:`VLLMNcclChannel` imports them (the learner's environment needs ``vllm`` then).
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from mutualrl.config.engines import engine_facts
from mutualrl.weights.transport import BroadcastChannel, CollectiveSender, GroupChannel, hf_sender

SGLANG_GROUP = "weight_update_group"


def resolve_backend(backend: str, engine: str, device: str) -> str:
    """``auto``: NCCL when the receiving engine runs on a GPU (a vLLM/SGLang server, or the hf
    engine on cuda), gloo otherwise."""
    if backend != "auto":
        return backend
    return "nccl" if engine_facts(engine).gpu or device.startswith("cuda") else "gloo"


def named_torch_group(host: str, port: int, rank: int, world: int, backend: str, group_name: str,
                      timeout_s: float) -> dist.ProcessGroup:
    """A process group built the way SGLang's workers build their weight-update group: torch's
    ``tcp://`` rendezvous, a store prefixed with the group's name, and torch's group helper —
    apart from (and alongside) any default process group of a sharded learner."""
    from torch.distributed.distributed_c10d import _new_process_group_helper, _world, rendezvous

    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, world = next(rendezvous(f"tcp://{host}:{port}", rank, world, timeout=timeout))
    store.set_timeout(timeout)
    pg, *_ = _new_process_group_helper(world, rank, [], backend, dist.PrefixStore(group_name, store),
                                       group_name=group_name, timeout=timeout)
    _world.pg_group_ranks[pg] = {i: i for i in range(world)}
    return pg


class VLLMNcclChannel:
    """The learner's end of vLLM's NCCL weight transfer: vLLM's ``StatelessProcessGroup`` and
    PyNccl communicator (what the workers build on ``/init_weight_transfer_engine``), one
    broadcast per tensor (``packed`` off)."""

    def __init__(self, host: str, port: int, world: int, device: str):
        try:
            from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
            from vllm.distributed.utils import StatelessProcessGroup
        except ImportError as e:  # a CPU install, or a learner image without vLLM
            raise RuntimeError("the collective weights transport into a vLLM server needs the vllm package in the "
                               "learner's environment (its workers join a vLLM StatelessProcessGroup with PyNccl); "
                               "install it, or use weights.transport=filesystem") from e
        pg = StatelessProcessGroup.create(host=host, port=port, rank=0, world_size=world)
        self.comm = PyNcclCommunicator(pg, device=torch.device(device))

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Send ``tensor`` from rank 0 over vLLM's NCCL communicator."""
        self.comm.broadcast(tensor, src=0, stream=torch.cuda.current_stream())


def learner_sender(engine: str, host: str, port: int, receivers: int, backend: str, timeout_s: float,
                   device: str = "cpu") -> CollectiveSender:
    """The learner's (rank 0) end of the weight group of a policy whose rollouts run on ``engine``
    with ``receivers`` workers. A vLLM/SGLang server's workers join once, through the engine's
    route, so its group is built here (blocking until they joined); the HF engine meets the
    learner in a fresh group per version (:func:`~mutualrl.weights.transport.hf_sender`)."""
    world = 1 + receivers
    group = engine_facts(engine).weight_group
    if group == "per_version":
        return hf_sender(host, port, receivers, backend, timeout_s, device)
    if group == "torch_group":
        channel: BroadcastChannel = GroupChannel(named_torch_group(host, port, 0, world, backend, SGLANG_GROUP,
            timeout_s))
    else:  # vllm_nccl
        channel = VLLMNcclChannel(host, port, world, device)
    return CollectiveSender(lambda version: channel, device)


def parse_address(address: str | None, policy: str = "") -> tuple[str, int]:
    """``host:port`` → (host, port), with a message naming what is missing or wrong."""
    if not address:
        raise ValueError(f"{policy}: weights.transport collective needs the weight group's address (--weights-group "
                         "host:port)")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"weights group address must be host:port; got {address!r}")
    return host, int(port)
