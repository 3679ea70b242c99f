"""Weight transport behind one interface: how a learner's versioned weights reach its rollout engines.

Every transport offers what the learner and the engines call (docs/architecture.md, "One
training step"): ``put(policy, version, state, model_config) -> (uri, checksum)`` on the learner,
``get(uri, checksum) -> state`` on the engine (the URI and checksum travel in the signed
``WeightsPublished`` message), and ``acknowledge(policy, version)`` once a version is served.

- :class:`~mutualrl.weights.store.WeightStore` (``filesystem``): a safetensors checkpoint per
  version in a shared directory (or memory, embedded); the integrity check runs once per version.
- :class:`CollectiveTransport` (``nccl``; ``gloo`` on CPU): the learner broadcasts the tensors
  into the engine's workers over a process group of its own — no file is written or hashed on
  disk. Per version: a header (policy, version, names, dtypes, shapes, checksum) and then every
  tensor, in order, from rank 0; the engine checks the announced version and checksum. This is
  the protocol SGLang's ``/update_weights_from_distributed`` and vLLM's NCCL weight transfer
  speak (names, dtypes and shapes, then one broadcast per tensor); here an HF engine is the
  receiver, so CI exercises it over gloo.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import Protocol

import torch
import torch.distributed as dist

_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool)}


class WeightTransport(Protocol):
    """What a learner publishes weights through and a rollout engine loads them from."""

    def put(self, policy: str, version: int, state: dict[str, torch.Tensor], model_config=None) -> tuple[str, str]: ...

    def get(self, uri: str, checksum: str | None = None) -> dict[str, torch.Tensor]: ...

    def acknowledge(self, policy: str, version: int) -> None: ...


def tensor_checksum(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names and raw bytes in name order (the filesystem store's checksum)."""
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def weight_group(host: str, port: int, rank: int, world: int, backend: str = "gloo", timeout_s: float = 300.0) -> dist.ProcessGroup:
    """A process group for weight updates only (rank 0 the learner, 1.. the engine workers), apart
    from any training group, over a TCP rendezvous at ``host:port`` that rank 0 hosts."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.PrefixStore("mutualrl-weights", dist.TCPStore(host, port, world, is_master=(rank == 0), timeout=timeout))
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world, timeout)
    if backend == "nccl":
        return dist.ProcessGroupNCCL(store, rank, world)
    raise ValueError(f"weight group backend must be gloo or nccl; got {backend!r}")


class CollectiveTransport:
    """Broadcast weights from the learner (rank 0 of ``group``) into engine workers (ranks 1..).

    ``put`` (learner) returns once every receiver has the tensors; ``get`` (engine) blocks until the
    learner sends. The receiver takes every tensor before it checks anything, so a refused
    version never leaves the sender hanging; it refuses a header other than the announced
    policy and version, a version not newer than the one it serves, and a checksum other than
    the announced one or than the bytes it received (ValueError)."""

    def __init__(self, group: dist.ProcessGroup, rank: int, device: str = "cpu"):
        self.group = group
        self.rank = rank
        self.device = device
        self.root = None  # nothing on disk (the learner's `model_config` is not needed)
        self.last_version: dict[str, int] = {}

    def _broadcast(self, t: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([t], opts).wait()

    def _send_header(self, header: dict) -> None:
        data = torch.tensor(list(json.dumps(header).encode()), dtype=torch.uint8)
        self._broadcast(torch.tensor([data.numel()], dtype=torch.int64))
        self._broadcast(data)

    def _recv_header(self) -> dict:
        n = torch.zeros(1, dtype=torch.int64)
        self._broadcast(n)
        data = torch.zeros(int(n.item()), dtype=torch.uint8)
        self._broadcast(data)
        return json.loads(bytes(data.tolist()).decode())

    def put(self, policy: str, version: int, state: dict[str, torch.Tensor], model_config=None) -> tuple[str, str]:
        if self.rank != 0:
            raise RuntimeError("only rank 0 (the learner) sends weights")
        cpu = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
        checksum = tensor_checksum(cpu)
        names = list(cpu)
        self._send_header({"policy": policy, "version": version, "checksum": checksum, "names": names,
                           "dtypes": [str(cpu[k].dtype).removeprefix("torch.") for k in names], "shapes": [list(cpu[k].shape) for k in names]})
        for k in names:
            self._broadcast(cpu[k].to(self.device) if self.device != "cpu" else cpu[k])
        self.last_version[policy] = version
        return f"collective://{policy}/{version}", checksum

    def get(self, uri: str, checksum: str | None = None) -> dict[str, torch.Tensor]:
        if not uri.startswith("collective://"):
            raise ValueError(f"{uri}: not a collective weights URI")
        policy, _, version = uri.removeprefix("collective://").rpartition("/")
        header = self._recv_header()
        unknown = [d for d in header["dtypes"] if d not in _DTYPES]
        if unknown:
            raise ValueError(f"{uri}: unsupported dtypes {unknown}")
        state = {}
        for name, dtype, shape in zip(header["names"], header["dtypes"], header["shapes"]):
            t = torch.empty(shape, dtype=_DTYPES[dtype], device=self.device)
            self._broadcast(t)
            state[name] = t.cpu() if self.device != "cpu" else t
        if header["policy"] != policy or int(header["version"]) != int(version):
            raise ValueError(f"{uri}: the learner sent {header['policy']} v{header['version']}")
        if int(version) <= self.last_version.get(policy, 0):
            raise ValueError(f"{uri}: version {version} is not newer than the served {self.last_version[policy]}")
        if checksum and header["checksum"] != checksum:
            raise ValueError(f"{uri}: announced checksum differs from the one sent")
        if tensor_checksum(state) != header["checksum"]:
            raise ValueError(f"checksum mismatch for {uri}")
        self.last_version[policy] = int(version)
        return state

    def acknowledge(self, policy: str, version: int) -> None:
        """Nothing is kept between versions."""
