"""Weight transport behind one interface: how a learner's versioned weights reach its rollout engines.

Every transport has two halves (docs/architecture.md, "Weights"): a :class:`WeightSender`
(``publish(policy, version, state, announce)``, on the learner) and a :class:`WeightReceiver`
(``get(uri, checksum, manifest)`` on the engine, ``acknowledge(policy, version)`` once a version is
served). The handshake on top of them — versions, announcements, asking again — is
:mod:`mutualrl.weights.handshake`. The transport decides *when* it announces, because the two kinds need opposite
orders:

- :class:`~mutualrl.weights.store.WeightStore` (``filesystem``): a safetensors checkpoint per
  version in a shared directory (or memory, embedded); written first, then announced, so a
  reader never sees a version that is not durable. The integrity check runs once per version.
- :class:`CollectiveSender` / :class:`CollectiveReceiver` (``collective``: NCCL on GPUs, gloo on
  CPU): nothing is written or hashed on disk. The learner announces first — the signed
  ``WeightsPublished`` carries the checksum and the manifest (names, dtypes, shapes, in order)
  — and then broadcasts every tensor, in manifest order, from rank 0 of a process group of its
  own; each broadcast returns once every receiver took the tensor. That is the wire of SGLang's
  ``/update_weights_from_distributed`` and vLLM's NCCL weight transfer (one broadcast per
  tensor of a names/dtypes/shapes list announced out of band), and of our HF engine's
  :class:`CollectiveReceiver`, which CI runs over gloo.
"""

from __future__ import annotations

import datetime
import hashlib
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

import torch
import torch.distributed as dist

from mutualrl.v1 import experience_pb2 as pb

_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                                      torch.int64, torch.int32, torch.uint8, torch.bool)}
COLLECTIVE_SCHEME = "collective://"


@dataclass(frozen=True)
class TensorManifest:
    """The tensors of one broadcast version, in the order they are sent."""
    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, state: dict[str, torch.Tensor]) -> "TensorManifest":
        """The manifest of a state dict: its names, dtypes and shapes in order."""
        names = tuple(state)
        return cls(names, tuple(str(state[k].dtype).removeprefix("torch.") for k in names),
                   tuple(tuple(state[k].shape) for k in names))

    def __post_init__(self) -> None:
        if not (len(self.names) == len(self.dtypes) == len(self.shapes)):
            raise ValueError(f"manifest lists differ in length: {len(self.names)} names, {len(self.dtypes)} dtypes, "
                             f"{len(self.shapes)} shapes")
        unknown = sorted({d for d in self.dtypes if d not in _DTYPES})
        if unknown:
            raise ValueError(f"manifest names unsupported dtypes {unknown}")

    def to_proto(self) -> list[pb.TensorSpec]:
        """The manifest as ``TensorSpec`` messages for a ``WeightsPublished`` announcement."""
        return [pb.TensorSpec(name=n, dtype=d, shape=list(s)) for n, d, s in zip(self.names, self.dtypes, self.shapes)]

    @classmethod
    def from_proto(cls, specs) -> "TensorManifest | None":
        """The manifest of an announcement, or None when it carries none (the filesystem transport)."""
        specs = list(specs)
        if not specs:
            return None
        return cls(tuple(t.name for t in specs), tuple(t.dtype for t in specs),
                   tuple(tuple(int(x) for x in t.shape) for t in specs))

    def empty(self, device: str = "cpu") -> list[torch.Tensor]:
        """Empty tensors of the manifest's dtypes and shapes on ``device``, to receive a broadcast into."""
        return [torch.empty(shape, dtype=_DTYPES[d], device=device) for d, shape in zip(self.dtypes, self.shapes)]

    def byte_count(self) -> int:
        """The bytes of all tensors."""
        return sum(torch.empty((), dtype=_DTYPES[d]).element_size() * int(torch.Size(s).numel())
                   for d, s in zip(self.dtypes, self.shapes))


class VersionSuperseded(RuntimeError):
    """A receiver could not take the announced version because a newer one replaced it (a shared-memory slot
    rewritten, or gone with a restarted learner): the handshake loads the newest announcement instead of counting a
    refusal."""


class NeedsFullVersion(VersionSuperseded):
    """A receiver cannot rebuild the announced version from what its engine serves (a delta against a version it
    never loaded: it restarted, or skipped one): the handshake asks the learner to send the weights again, whole."""


class WeightsTorn(Exception):  # noqa: N818 - named for what happened, like VersionSuperseded
    """An engine's weights were overwritten in place and could not be completed with one whole version (a
    shared-memory slot rewritten while it was copied, and never settled again): what the engine holds is a mix of
    versions. Deliberately neither a ValueError nor a RuntimeError, which the handshake counts as a refused version
    and serves on: this one ends the weights follower, and the rollout service exits to be restarted on whole
    weights, before anything is sampled from the mix."""


def check_fits(uri: str, shapes: dict[str, tuple[int, ...]], target: dict[str, torch.Tensor]) -> None:
    """A version fits an engine when it names exactly the engine's tensors with their shapes, up to a tied LM head
    (stored once, under the embedding's name). Checked before anything is written into ``target``."""
    missing = [k for k in target if k not in shapes and not k.endswith("lm_head.weight")]
    unexpected = [k for k in shapes if k not in target]
    wrong = [k for k, shape in shapes.items() if k in target and tuple(target[k].shape) != tuple(shape)]
    if missing or unexpected or wrong:
        raise ValueError(f"weights at {uri} do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}, "
                         f"wrong shape {wrong[:3]}")


Announce = Callable[[str, str, "TensorManifest | None"], None]
"""``announce(uri, checksum, manifest)``: publish the signed ``WeightsPublished`` (the manifest is
None for the filesystem transport)."""


class WeightSender(Protocol):
    """The learner's half of a transport: publishes a version (and decides when it is announced)."""

    def publish(self, policy: str, version: int, state: dict[str, torch.Tensor], announce: Announce,
                model_config=None) -> tuple[str, str]:
        """Publish a version: write or send its tensors and ``announce`` it, in the transport's order; returns (uri,
        checksum)."""


class WeightReceiver(Protocol):
    """A rollout engine's half: loads a version by its URI and says which one it serves."""

    def get(self, uri: str, checksum: str | None = None,
            manifest: TensorManifest | None = None) -> dict[str, torch.Tensor]:
        """A version's tensors by URI."""

    def acknowledge(self, policy: str, version: int) -> None:
        """The engine serves ``version``: older versions may go."""


class StreamingReceiver(WeightReceiver, Protocol):
    """A receiver that can copy a version into an engine's tensors one tensor at a time, so loading a version
    holds one tensor beside the served weights instead of a whole second copy (a 0.5B model's 2.5 GB in fp32)."""

    def load_into(self, uri: str, checksum: str | None, target: dict[str, torch.Tensor]) -> None:
        """Overwrite ``target``'s tensors in place with the version at ``uri``. Raises before writing anything when
        the version is missing, does not fit ``target`` or fails its checksum."""


def tensor_checksum(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names and raw bytes in name order (the filesystem store's checksum). The bytes are hashed
    through the buffer protocol, not copied into a ``bytes`` first."""
    return checksum_of_stream((k, state[k]) for k in sorted(state))


def checksum_of_stream(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """``tensor_checksum`` over (name, tensor) pairs given one at a time in name order: a version read from a file
    tensor by tensor is checked without holding all of it."""
    h = hashlib.sha256()
    for k, t in named:
        h.update(k.encode())
        t = t.detach().cpu().contiguous()
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def untied(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` without the second name of a tensor that shares storage with an earlier one (a tied LM head is
    the input embedding: the receiving module ties it again), so a version carries each tensor once."""
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    out = {}
    for k, v in state.items():
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape)) if v.numel() else None
        if key is not None and key in seen:
            continue
        if key is not None:
            seen.add(key)
        out[k] = v
    return out


def collective_uri(policy: str, version: int) -> str:
    """The URI a collective weights version is announced under: ``collective://<policy>/<version>``."""
    return f"{COLLECTIVE_SCHEME}{policy}/{version}"


def parse_collective_uri(uri: str) -> tuple[str, int]:
    """(policy, version) of a collective weights URI; a ValueError for anything else."""
    if not uri.startswith(COLLECTIVE_SCHEME):
        raise ValueError(f"{uri}: not a collective weights URI")
    policy, _, version = uri.removeprefix(COLLECTIVE_SCHEME).rpartition("/")
    if not policy or not version.isdigit():
        raise ValueError(f"{uri}: expected collective://<policy>/<version>")
    return policy, int(version)


def rendezvous_store(host: str, port: int, world: int, is_master: bool, timeout_s: float = 300.0) -> dist.TCPStore:
    """The TCP store of a weight group: rank 0 (the learner) hosts it, receivers connect to it."""
    return dist.TCPStore(host, port, world, is_master=is_master, timeout=datetime.timedelta(seconds=timeout_s))


def weight_group(host: str, port: int, rank: int, world: int, backend: str = "gloo", timeout_s: float = 300.0,
                 store: dist.Store | None = None, prefix: str = "mutualrl-weights",
                 join_timeout_s: float | None = None) -> dist.ProcessGroup:
    """A process group for weight updates only (rank 0 the learner, 1.. the HF engine receivers),
    apart from any training group, over a TCP rendezvous at ``host:port`` that rank 0 hosts.
    ``store``: an open store to reuse (the learner keeps its server across versions); ``prefix``
    keeps the groups built on one store apart; ``join_timeout_s``: how long the rendezvous waits
    for the other ranks (``timeout_s`` then bounds each transfer)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    base = store if store is not None else rendezvous_store(host, port, world, rank == 0, join_timeout_s or timeout_s)
    scoped = dist.PrefixStore(prefix, base)
    if backend == "gloo":
        if join_timeout_s is None:
            return dist.ProcessGroupGloo(scoped, rank, world, timeout)
        group = dist.ProcessGroupGloo(scoped, rank, world, datetime.timedelta(seconds=join_timeout_s))  # the rendezvous
        group.set_timeout(timeout)  # each transfer
        return group
    if backend == "nccl":
        return dist.ProcessGroupNCCL(scoped, rank, world)
    raise ValueError(f"weight group backend must be gloo or nccl; got {backend!r}")


class BroadcastChannel(Protocol):
    """One group the learner broadcasts into (rank 0 the source)."""

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Send ``tensor`` (rank 0) or receive into it (the other ranks)."""


class GroupChannel:
    """A ``torch.distributed`` process group, rank 0 the source (our receivers and SGLang's)."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast ``tensor`` from rank 0 over the process group."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([tensor], opts).wait()


class CollectiveSender:
    """The learner's end: announce, then broadcast every tensor in manifest order. ``publish``
    returns once every receiver took every tensor.

    ``connect(version)`` gives the channel a version travels on: one long-lived group for a
    vLLM/SGLang server (its workers join once, through the engine's route), or a fresh group per
    version for our HF receivers (:func:`hf_sender`) — so a restarted learner or rollout service
    simply meets the other end at the next version, and nothing waits on a dead peer's group."""

    def __init__(self, connect: Callable[[int], BroadcastChannel], device: str = "cpu"):
        self.connect = connect
        self.device = device  # where tensors are broadcast from (the NCCL device on GPUs)
        self.root = None  # nothing on disk: the learner's `model_config` is not needed

    def publish(self, policy: str, version: int, state: dict[str, torch.Tensor], announce: Announce,
                model_config=None) -> tuple[str, str]:
        """Announce the version with its manifest, then broadcast the tensors to the receivers."""
        cpu = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
        checksum, manifest, uri = tensor_checksum(cpu), TensorManifest.of(cpu), collective_uri(policy, version)
        announce(uri, checksum, manifest)  # receivers start taking tensors from here
        channel = self.connect(version)
        for name in manifest.names:
            channel.broadcast(cpu[name] if self.device == "cpu" else cpu[name].to(self.device))
        return uri, checksum


class CollectiveReceiver:
    """An HF engine's end: joins the announced version's group, takes every tensor, then checks.

    Every tensor is taken before anything is checked, so a refused version never leaves the
    learner hanging; it refuses a version not newer than the one it serves and bytes whose
    checksum differs from the announced one (ValueError)."""

    def __init__(self, connect: Callable[[int], dist.ProcessGroup], device: str = "cpu"):
        self.connect = connect
        self.device = device
        self.root = None
        self.last_version: dict[str, int] = {}

    def get(self, uri: str, checksum: str | None = None,
            manifest: TensorManifest | None = None) -> dict[str, torch.Tensor]:
        """Receive an announced version's tensors from the learner's broadcast."""
        policy, version = parse_collective_uri(uri)
        if manifest is None:
            raise ValueError(f"{uri}: a collective version needs the announced manifest (names, dtypes, shapes)")
        channel = GroupChannel(self.connect(version))
        state = {}
        for name, t in zip(manifest.names, manifest.empty(self.device)):
            channel.broadcast(t)
            state[name] = t if self.device == "cpu" else t.cpu()
        if version <= self.last_version.get(policy, 0):
            raise ValueError(f"{uri}: version {version} is not newer than the served {self.last_version[policy]}")
        if checksum and tensor_checksum(state) != checksum:
            raise ValueError(f"checksum mismatch for {uri}: the bytes received are not the announced version")
        self.last_version[policy] = version
        return state

    def acknowledge(self, policy: str, version: int) -> None:
        """Nothing is kept between versions."""


def hf_sender(host: str, port: int, receivers: int = 1, backend: str = "gloo", timeout_s: float = 300.0,
              device: str = "cpu") -> CollectiveSender:
    """The learner's end for HF engine receivers: it hosts the rendezvous store (opened on the
    first version) and builds a fresh group per version under the prefix ``v<version>``."""
    store: list[dist.TCPStore] = []

    def connect(version: int) -> BroadcastChannel:
        if not store:
            store.append(rendezvous_store(host, port, 1 + receivers, True, timeout_s))
        return GroupChannel(weight_group(host, port, 0, 1 + receivers, backend, timeout_s, store=store[0],
                                         prefix=f"v{version}"))

    return CollectiveSender(connect, device)


JOIN_RETRY_S = 10.0


def hf_receiver(host: str, port: int, rank: int = 1, receivers: int = 1, backend: str = "gloo",
                timeout_s: float = 300.0,
                device: str = "cpu", newest: Callable[[], int] | None = None) -> CollectiveReceiver:
    """An HF engine's end: for each announced version it connects to the learner's store and joins
    that version's group. It waits at most ``timeout_s`` for the learner, re-checking every
    ``JOIN_RETRY_S`` whether ``newest()`` (the newest announced version) has moved past it: a
    version whose learner died before sending it is then given up (ValueError), never waited on
    while the restarted learner waits in the next version's group."""
    def connect(version: int) -> dist.ProcessGroup:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return weight_group(host, port, rank, 1 + receivers, backend, timeout_s, prefix=f"v{version}",
                                    join_timeout_s=min(JOIN_RETRY_S, timeout_s))
            # the store is gone (learner restarting) or the learner is not there yet
            except (RuntimeError, TimeoutError) as e:
                if newest is not None and newest() > version:
                    raise ValueError(f"weights version {version} was superseded before the learner sent it") from e
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)

    return CollectiveReceiver(connect, device)
