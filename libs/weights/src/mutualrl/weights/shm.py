"""The ``shm`` weight transport: a learner and its engine on one host exchange a version through shared memory.

The filesystem transport writes every version as a safetensors file and reads it back (for SmolLM2-135M
0.54 GB and 1.5–2.5 s a step); the collective one needs a process group. On one host a version needs
neither: the learner copies its tensors into a memory-mapped file under ``/dev/shm`` and the engine
copies them out — two memcpys.

- **Double-buffered.** Version v goes to slot ``v % 2``, so the engine can read v−1 while the learner
  writes v. Each slot is a file ``mutualrl-<tag>-<policy>-<slot>`` (tag: the run's weights directory),
  mapped once by each side and written in place (remapped only when a restarted learner recreates it).
- **A seqlock per slot** (header: magic, sequence, version, bytes, the learner's pid): the learner makes
  the sequence odd, writes, records the version, makes it even. A reader copies the tensors out and
  checks the sequence did not move and the version is the one announced; otherwise the version was
  superseded while it read (the engine lagged two versions) and :class:`VersionSuperseded` says so —
  the handshake then loads the newest instead. The tensors' names, dtypes and shapes travel in the
  signed announcement (the same manifest the collective transport sends); their offsets follow from it.
- **Straight into the engine's tensors.** An hf engine's load copies each tensor from the slot into the
  parameter it replaces (:meth:`ShmReceiver.copy_into`), with no whole copy of the version in between (that
  copy was as large as the weights: 0.54 GB for SmolLM2 in fp32, at every load). A slot rewritten mid-copy
  leaves a mix in the engine, so the copy is not given up there: it is made again from the newer version the
  slot now holds, before the engine serves anything, and the engine serves that one (:class:`WeightsTorn` if
  the slot never settles).
- **Room checked, orphans reclaimed.** Slots are allocated with ``posix_fallocate``, so a ``/dev/shm``
  too small for two versions is one clear :class:`ShmTooSmall` line at the first publish, not a SIGBUS
  mid-copy. A learner unlinks its slots when it stops; a killed one leaves them, and the next learner's
  start removes every slot whose recorded pid is gone (and its own policy's, whatever the pid).

The checksum announced is the slot's identity (``shm:<version>:<bytes>``), not a hash of the bytes:
on one host the announcement is signed and the memory is the host's, so the integrity a hash buys over
a shared directory buys nothing here, at ~1 s per 0.5 GB.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import torch

from mutualrl.weights.transport import (
    _DTYPES,
    Announce,
    TensorManifest,
    VersionSuperseded,
    WeightsTorn,
    check_fits,
    untied,
)

SHM_SCHEME = "shm://"
DEFAULT_DIR = Path("/dev/shm")
MAGIC = b"MRLSHM01"
HEADER = struct.Struct("<8sqqqq")  # magic, sequence, version, data bytes, learner pid
HEADER_BYTES = 4096  # the data starts page-aligned
ALIGN = 64
log = logging.getLogger("mutualrl.weights.shm")


class ShmTooSmall(RuntimeError):
    """The shared-memory filesystem cannot hold two versions of a policy's weights."""


def run_tag(weights_dir: str | Path) -> str:
    """A short tag of a run's weights directory: the learner and the engine of one run name slots alike."""
    return hashlib.sha256(str(Path(weights_dir).resolve()).encode()).hexdigest()[:10]


def offsets(manifest: TensorManifest) -> tuple[list[int], int]:
    """Each tensor's byte offset in a slot's data (64-byte aligned, in manifest order) and the data's size."""
    out, pos = [], 0
    for d, shape in zip(manifest.dtypes, manifest.shapes):
        out.append(pos)
        n = torch.empty((), dtype=_DTYPES[d]).element_size() * int(torch.Size(shape).numel())
        pos += -(-n // ALIGN) * ALIGN
    return out, pos


@dataclass
class _Mapping:
    """A slot file mapped into this process: the file's inode (a recreated file is remapped) and its bytes."""
    inode: int
    buf: torch.Tensor  # uint8 [size]

    @classmethod
    def open(cls, path: Path) -> "_Mapping":
        st = os.stat(path)
        return cls(st.st_ino, torch.from_file(str(path), shared=True, size=st.st_size, dtype=torch.uint8))

    def header(self) -> tuple[int, int, int, int]:
        magic, seq, version, nbytes, pid = HEADER.unpack(self.buf[: HEADER.size].numpy().tobytes())
        if magic != MAGIC:
            raise ValueError("not a mutualrl weights slot")
        return seq, version, nbytes, pid

    def set_header(self, seq: int, version: int, nbytes: int, pid: int) -> None:
        raw = HEADER.pack(MAGIC, seq, version, nbytes, pid)
        self.buf[: HEADER.size].copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reclaim(directory: Path, own_prefix: str | None = None) -> list[Path]:
    """Unlink orphaned slots under ``directory``: every ``mutualrl-*`` slot whose learner pid is gone, and
    (``own_prefix``) this learner's own earlier slots. The files removed."""
    removed = []
    for path in directory.glob("mutualrl-*"):
        try:
            mine = own_prefix is not None and path.name.startswith(own_prefix)
            if not mine:
                with path.open("rb") as f:
                    raw = f.read(HEADER.size)
                if len(raw) < HEADER.size or raw[:8] != MAGIC or _pid_alive(HEADER.unpack(raw)[4]):
                    continue
            path.unlink()
            removed.append(path)
        except (FileNotFoundError, struct.error):
            continue
    if removed:
        log.info("reclaimed orphaned weight slots", extra={"fields": {"slots": [p.name for p in removed]}})
    return removed


def parse_shm_uri(uri: str) -> tuple[Path, int]:
    """(slot file, version) of ``shm:///dev/shm/mutualrl-…-0?version=7``."""
    if not uri.startswith(SHM_SCHEME):
        raise ValueError(f"{uri}: not a shared-memory weights URI")
    u = urlparse(uri)
    version = parse_qs(u.query).get("version", [""])[0]
    if not u.path or not version.isdigit():
        raise ValueError(f"{uri}: expected shm://<slot file>?version=<n>")
    return Path(u.path), int(version)


class ShmSender:
    """The learner's half: writes each version into its slot in place, then announces it."""

    def __init__(self, weights_dir: str | Path, policy: str, directory: str | Path = DEFAULT_DIR):
        self.dir = Path(directory)
        self.policy = policy
        self.prefix = f"mutualrl-{run_tag(weights_dir)}-{policy}-"
        self.dir.mkdir(parents=True, exist_ok=True)
        reclaim(self.dir, own_prefix=self.prefix)
        self._maps: dict[int, _Mapping] = {}
        self.last_bytes = 0  # the last version's data bytes (the seconds are the learner's weight_sync stage)

    def slot_path(self, slot: int) -> Path:
        """The file of slot 0 or 1."""
        return self.dir / f"{self.prefix}{slot}"

    def _slot(self, slot: int, size: int) -> _Mapping:
        m = self._maps.get(slot)
        if m is not None and m.buf.numel() >= size:
            return m
        path = self.slot_path(slot)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            os.close(fd)
            path.unlink(missing_ok=True)
            if e.errno in (errno.ENOSPC, errno.EFBIG):
                free = os.statvfs(self.dir)
                raise ShmTooSmall(
                    f"{self.policy}: {self.dir} has {free.f_bavail * free.f_frsize / 2**20:.0f} MiB free and a "
                    f"weights version needs {size / 2**20:.0f} MiB in each of two slots: give the container a larger "
                    "/dev/shm (compose `shm_size`, `docker run --shm-size`, a memory-backed emptyDir in a pod) or set "
                    "weights.transport=filesystem") from e
            raise
        os.close(fd)
        m = _Mapping.open(path)
        m.set_header(0, 0, 0, os.getpid())
        self._maps[slot] = m
        return m

    def publish(self, policy: str, version: int, state: dict[str, torch.Tensor], announce: Announce,
                model_config=None) -> tuple[str, str]:
        """Write the version into slot ``version % 2`` under its seqlock, then announce it with its manifest."""
        manifest = TensorManifest.of(untied(state))
        offs, nbytes = offsets(manifest)
        slot = version % 2
        m = self._slot(slot, HEADER_BYTES + nbytes)
        seq = m.header()[0]
        m.set_header(seq + 1, 0, nbytes, os.getpid())  # odd: being written
        data = m.buf[HEADER_BYTES:]
        with torch.no_grad():
            for name, off in zip(manifest.names, offs):
                t = state[name].detach().contiguous().reshape(-1)
                data[off: off + t.numel() * t.element_size()].copy_(t.view(torch.uint8))
        m.set_header(seq + 2, version, nbytes, os.getpid())
        uri = f"{SHM_SCHEME}{self.slot_path(slot)}?version={version}"
        checksum = f"shm:{version}:{nbytes}"
        self.last_bytes = nbytes
        announce(uri, checksum, manifest)
        return uri, checksum

    def close(self) -> None:
        """Unlink this learner's slots (a clean stop; a killed learner's are reclaimed by the next start)."""
        self._maps.clear()
        for slot in (0, 1):
            self.slot_path(slot).unlink(missing_ok=True)


class ShmReceiver:
    """The engine's half: copies a version out of its slot, checked against the seqlock."""

    def __init__(self) -> None:
        self._maps: dict[Path, _Mapping] = {}
        self.last_bytes = 0  # the last version's (the seconds: the follower's last_load_s)

    def _map(self, path: Path) -> _Mapping:
        try:
            inode = os.stat(path).st_ino
        except FileNotFoundError as e:
            raise VersionSuperseded(f"no weights slot at {path}: the learner stopped or restarted (a restarted "
                                    "learner sends its weights again as a new version)") from e
        m = self._maps.get(path)
        if m is None or m.inode != inode:  # first use, or a restarted learner recreated the slot
            m = self._maps[path] = _Mapping.open(path)
        return m

    def _open_version(self, uri: str, checksum: str | None,
                      manifest: TensorManifest | None) -> tuple[int, _Mapping, list[int], int, int]:
        """The slot of the announced version, checked to hold it whole: (version, mapping, offsets, bytes,
        sequence)."""
        if manifest is None:
            raise ValueError(f"{uri}: a shared-memory version needs its announced manifest")
        path, version = parse_shm_uri(uri)
        m = self._map(path)
        offs, nbytes = offsets(manifest)
        seq, at, size, _ = m.header()
        if seq % 2 or at != version or size != nbytes:
            raise VersionSuperseded(f"{uri}: the slot holds version {at}{' (being written)' if seq % 2 else ''}, "
                                    f"not {version}")
        if checksum and checksum != f"shm:{version}:{nbytes}":
            raise ValueError(f"checksum mismatch for {uri}")
        if m.buf.numel() < HEADER_BYTES + nbytes:  # the slot grew for a larger version (a whole one after deltas)
            m = self._maps[path] = _Mapping.open(path)
        return version, m, offs, nbytes, seq

    @staticmethod
    def _views(m: _Mapping, manifest: TensorManifest, offs: list[int]) -> dict[str, torch.Tensor]:
        """Each tensor of the slot, as a view of the mapping (no copy)."""
        data = m.buf[HEADER_BYTES:]
        out = {}
        for name, d, shape, off in zip(manifest.names, manifest.dtypes, manifest.shapes, offs):
            dtype = _DTYPES[d]
            n = torch.empty((), dtype=dtype).element_size() * int(torch.Size(shape).numel())
            out[name] = data[off: off + n].view(dtype).reshape(shape)
        return out

    def get(self, uri: str, checksum: str | None = None,
            manifest: TensorManifest | None = None) -> dict[str, torch.Tensor]:
        """The announced version's tensors (copies: the slot may be rewritten two versions later)."""
        _, m, offs, nbytes, seq = self._open_version(uri, checksum, manifest)
        out = {k: v.clone() for k, v in self._views(m, manifest, offs).items()}
        if m.header()[0] != seq:
            raise VersionSuperseded(f"{uri}: rewritten with a newer version while it was read")
        self.last_bytes = nbytes
        return out

    def copy_into(self, uri: str, checksum: str | None, manifest: TensorManifest | None,
                  target: dict[str, torch.Tensor], settle_s: float = 30.0) -> int:
        """Copy the announced version from its slot straight into ``target`` (an engine's state dict: its
        parameters, cast to their dtype as they are written) and return the version ``target`` now holds.

        Refused before anything is written when the version does not fit ``target``, is no longer in its slot
        (:class:`VersionSuperseded`) or its checksum is wrong. If the learner rewrites the slot while it is copied
        (the engine lagged two versions), ``target`` holds a mix: the copy is made again from the newer version the
        slot then holds, once its writer is done, and that version is returned. The caller holds the engine's lock
        throughout, so nothing samples from the mix. :class:`WeightsTorn` when that cannot be done within
        ``settle_s``: the writer died mid-write, the newer version is a delta (other tensors), or the slot kept
        being rewritten."""
        version, m, offs, nbytes, seq = self._open_version(uri, checksum, manifest)
        check_fits(uri, {k: tuple(s) for k, s in zip(manifest.names, manifest.shapes)}, target)
        deadline = time.monotonic() + settle_s
        while True:
            with torch.no_grad():
                for name, view in self._views(m, manifest, offs).items():
                    target[name].copy_(view)
            now, at, size, _ = m.header()
            if now == seq:
                self.last_bytes = nbytes
                return version
            log.warning("weights slot rewritten while it was copied into the engine: copying the newer version",
                        extra={"fields": {"version": version}})
            while now % 2 and time.monotonic() < deadline:  # its writer is still at it
                time.sleep(0.01)
                now, at, size, _ = m.header()
            if now % 2 or size != nbytes or time.monotonic() >= deadline:
                why = ("its writer did not finish" if now % 2 else
                       "it now holds other tensors (a delta)" if size != nbytes else "it kept being rewritten")
                raise WeightsTorn(f"{uri}: the slot was rewritten while it was copied into the engine and cannot "
                                  f"complete it ({why}, {settle_s:.0f} s): the engine's weights are a mix of versions")
            seq, version = now, at

    def acknowledge(self, policy: str, version: int) -> None:
        """Nothing to free: the two slots are rewritten in place."""
