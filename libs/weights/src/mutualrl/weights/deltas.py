"""Weights versions sent as the values that changed (docs/algorithms.md §7.3).

A bf16 engine holds ``bf16(master)``. One AdamW step at lr 1e-5 moves most fp32 master values by
less than half a bf16 spacing, so most bf16 values do not change from one version to the next
(SmolLM2: 2.4 % did, docs/results/real/weight-deltas-smollm2-lr1e-5.json). A version is therefore
sent as the positions and new values of what changed since the version before it, compressed —
and rebuilt on the engine's side bit for bit, because the base it is applied to is exactly what
the engine serves.

- :class:`DeltaSender` wraps any tensor transport's sender (filesystem, shm): it casts each
  version to the engine's dtype, keeps that as the next version's base, and sends a delta when one
  is at most ``max_share`` of the whole version's bytes, else the whole version (also the first
  after a start, and after :meth:`DeltaSender.reset`).
- :class:`DeltaReceiver` wraps the matching receiver: a whole version passes through; a delta is
  applied to the engine's own tensors (copies of them: sampling reads the served ones meanwhile)
  when the engine serves the delta's base version, and otherwise raises :class:`NeedsFullVersion`,
  on which the handshake asks the learner to send the weights again, whole.

The wire format of one changed tensor is one uint8 tensor: zlib (level 1) over a 16-byte header
(how many values changed, the values' dtype) and two arrays — the gaps between changed flat
positions (int32, the first gap being the first position, stored as four byte planes) and the new
values' raw bits. Gaps of sorted positions are small numbers, so their high planes are zeros.
"""

from __future__ import annotations

import struct
import zlib
from typing import Callable

import torch

from mutualrl.weights.transport import Announce, NeedsFullVersion, WeightReceiver, WeightSender, untied

BASE_KEY = "__delta__base"  # int64[1]: the version a delta applies to (absent: a whole version)
DELTA_PREFIX = "__delta__."  # + a tensor's name: its changed values
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CODES = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3, torch.float64: 4}
_DTYPE_OF = {v: k for k, v in _CODES.items()}
_HEADER = struct.Struct("<qq")  # count, dtype code


def is_delta(manifest) -> bool:
    """Whether an announced version (its manifest) is a delta, not a whole version."""
    return manifest is not None and BASE_KEY in manifest.names


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as integers of the same width, flattened: equal bits, equal integers (so a
    comparison sees a change of -0.0 to 0.0 and NaN to NaN as what they are, in their bits)."""
    return t.detach().contiguous().reshape(-1).view(_BITS[t.element_size()])


def encode_delta(new: torch.Tensor, base: torch.Tensor) -> torch.Tensor | None:
    """The changed values of ``new`` against ``base`` (same shape and dtype) as one compressed
    uint8 tensor; None when nothing changed."""
    if new.shape != base.shape or new.dtype != base.dtype:
        raise ValueError(f"a delta needs the same shape and dtype: {tuple(new.shape)} {new.dtype} against "
                         f"{tuple(base.shape)} {base.dtype}")
    if new.dtype not in _CODES:
        raise ValueError(f"deltas are for floating-point weights, not {new.dtype}")
    if new.numel() >= 2**31:
        raise ValueError(f"a tensor of {new.numel()} values is past the delta format's int32 positions")
    new_bits = bits(new)
    pos = (new_bits != bits(base)).nonzero().squeeze(-1)
    if not pos.numel():
        return None
    gaps = torch.diff(pos, prepend=pos.new_zeros(1)).to(torch.int32)
    # the gaps' bytes as four planes (all low bytes, then all second bytes, ...): the high planes are nearly all
    # zeros, which is what zlib compresses best (4.4 % of a whole SmolLM2 version against 5.5 % for plain int32 at
    # an lr 1e-6 step: benchmarks/bench_weight_deltas.py)
    planes = gaps.view(torch.uint8).reshape(-1, 4).t().contiguous()
    payload = (_HEADER.pack(pos.numel(), _CODES[new.dtype]) + planes.numpy().tobytes()
               + new_bits[pos].numpy().tobytes())
    return torch.frombuffer(bytearray(zlib.compress(payload, 1)), dtype=torch.uint8)


def apply_delta(target: torch.Tensor, blob: torch.Tensor) -> None:
    """Write a delta's values into ``target`` (contiguous) in place; values of another dtype than
    the target's are cast (a bf16 version applied to an fp32 engine)."""
    raw = bytearray(zlib.decompress(blob.numpy().tobytes()))
    count, code = _HEADER.unpack_from(raw)
    dtype = _DTYPE_OF.get(code)
    if dtype is None:
        raise ValueError(f"a weights delta names an unknown dtype code {code}")
    width = torch.empty((), dtype=dtype).element_size()
    if len(raw) != _HEADER.size + count * (4 + width):
        raise ValueError(f"a weights delta of {count} values has {len(raw)} bytes: it is cut or corrupt")
    planes = torch.frombuffer(raw, dtype=torch.uint8, count=4 * count, offset=_HEADER.size) if count else None
    gaps = (planes.reshape(4, count).t().reshape(-1).view(torch.int32).to(torch.int64) if count
            else torch.zeros(0, dtype=torch.int64))
    pos = torch.cumsum(gaps, 0)
    values = torch.frombuffer(raw, dtype=_BITS[width], count=count, offset=_HEADER.size + 4 * count).view(dtype)
    if count and int(pos[-1]) >= target.numel():
        raise ValueError(f"a weights delta writes position {int(pos[-1])} of a tensor of {target.numel()} values")
    target.view(-1)[pos] = values.to(target.dtype)


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` on the CPU in ``dtype``, never sharing memory with it (the learner updates it in place)."""
    t = t.detach()
    return t.to(device="cpu", dtype=dtype, copy=True).contiguous()


class DeltaSender:
    """A learner's sender that sends a version as its changes against the previous one when that
    is small (see the module docstring). ``last_kind`` ("full" or "delta") and ``last_bytes`` say
    what the last version cost; the base it keeps is one copy of the weights in ``dtype``."""

    def __init__(self, inner: WeightSender, dtype: torch.dtype, max_share: float = 0.5):
        if not 0.0 < max_share <= 1.0:
            raise ValueError(f"max_share must be in (0, 1], got {max_share}")
        self.inner = inner
        self.dtype = dtype
        self.max_share = max_share
        self._base: dict[str, torch.Tensor] | None = None
        self._base_version = 0
        self.last_kind = "full"
        self.last_bytes = 0

    def reset(self) -> None:
        """The next version goes whole (a rollout side asked again: it lacks the base of a delta)."""
        self._base = None

    def publish(self, policy: str, version: int, state: dict[str, torch.Tensor], announce: Announce,
                model_config=None) -> tuple[str, str]:
        """Publish ``version`` whole or as a delta against the version before it, through the wrapped sender."""
        cur = {k: _cast(v, self.dtype) for k, v in untied(state).items()}
        full_bytes = sum(t.numel() * t.element_size() for t in cur.values())
        send = self._delta(cur, full_bytes)
        kind = "delta" if send is not None else "full"
        if send is None:
            send = cur
        uri, checksum = self.inner.publish(policy, version, send, announce,
                                           model_config=model_config if kind == "full" else None)
        self._base, self._base_version = cur, version
        self.last_kind = kind
        self.last_bytes = sum(t.numel() * t.element_size() for t in send.values())
        return uri, checksum

    def _delta(self, cur: dict[str, torch.Tensor], full_bytes: int) -> dict[str, torch.Tensor] | None:
        """The delta against the kept base, or None when there is none or it is too large to be worth it."""
        base = self._base
        if base is None or base.keys() != cur.keys() or any(
                base[k].shape != cur[k].shape or base[k].dtype != cur[k].dtype for k in cur):
            return None
        out: dict[str, torch.Tensor] = {BASE_KEY: torch.tensor([self._base_version], dtype=torch.int64)}
        budget, size = self.max_share * full_bytes, 0
        for k, t in cur.items():
            blob = encode_delta(t, base[k])
            if blob is None:
                continue
            size += blob.numel()
            if size > budget:
                return None
            out[DELTA_PREFIX + k] = blob
        return out


class DeltaReceiver:
    """An engine's receiver that rebuilds delta versions on the engine's own tensors.

    :meth:`attach` tells it what the engine serves: ``current()`` its named tensors and
    ``served()`` the version they are; it is called once the engine exists (the engine is built
    with this receiver)."""

    def __init__(self, inner: WeightReceiver):
        self.inner = inner
        self._current: Callable[[], dict[str, torch.Tensor]] | None = None
        self._served: Callable[[], int] | None = None

    def attach(self, current: Callable[[], dict[str, torch.Tensor]], served: Callable[[], int]) -> None:
        """The engine whose tensors deltas are applied to."""
        self._current, self._served = current, served

    def get(self, uri: str, checksum: str | None = None, manifest=None) -> dict[str, torch.Tensor]:
        """A version's tensors: a whole one as sent, a delta rebuilt on the served base."""
        raw = self.inner.get(uri, checksum, manifest)
        if BASE_KEY not in raw:
            return raw
        if self._current is None or self._served is None:
            raise RuntimeError("a DeltaReceiver got a delta before it was attached to an engine")
        base, served = int(raw[BASE_KEY][0]), self._served()
        if served != base:
            raise NeedsFullVersion(f"{uri}: a delta against version {base}, and the engine serves version {served}")
        current = untied(self._current())
        unknown = sorted(k.removeprefix(DELTA_PREFIX) for k in raw if k.startswith(DELTA_PREFIX)
                         and k.removeprefix(DELTA_PREFIX) not in current)
        if unknown:
            raise ValueError(f"{uri}: a delta for tensors the engine does not have: {unknown[:3]}")
        out = {}
        for name, t in current.items():
            blob = raw.get(DELTA_PREFIX + name)
            if blob is None:
                out[name] = t
                continue
            rebuilt = t.detach().clone()
            apply_delta(rebuilt, blob)
            out[name] = rebuilt
        return out

    def copy_into(self, uri: str, checksum: str | None, manifest, target: dict[str, torch.Tensor]) -> int:
        """A whole version, straight into the engine's tensors by the wrapped receiver (the shared-memory one's
        ``copy_into``); a delta goes through :meth:`get`, which rebuilds it on those tensors."""
        if is_delta(manifest):
            raise ValueError(f"{uri}: a delta is rebuilt through get(), not copied whole")
        return self.inner.copy_into(uri, checksum, manifest, target)

    def acknowledge(self, policy: str, version: int) -> None:
        """Passed to the wrapped receiver."""
        self.inner.acknowledge(policy, version)
