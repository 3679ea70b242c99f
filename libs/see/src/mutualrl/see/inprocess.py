"""In-process SEE backend with the same semantics as Redis Streams, for embedded runs and tests."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from typing_extensions import override

from mutualrl.see.broker import Broker, Entry


@dataclass
class _Pending:
    consumer: str
    delivered_at: float
    deliveries: int


@dataclass
class _Group:
    last_id: tuple[int, int] = (0, 0)
    pending: "OrderedDict[str, _Pending]" = field(default_factory=OrderedDict)


@dataclass
class _Stream:
    entries: "OrderedDict[str, bytes]" = field(default_factory=OrderedDict)
    groups: dict[str, _Group] = field(default_factory=dict)
    last_id: tuple[int, int] = (0, 0)


def _parse(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class InProcessBroker(Broker):
    """Thread-safe; ``read`` with ``block_ms`` waits on a condition until data arrives."""

    def __init__(self, default_max_len: int | None = None):
        self._streams: dict[str, _Stream] = {}
        self._cond = threading.Condition()
        self.default_max_len = default_max_len

    def _stream(self, name: str) -> _Stream:
        return self._streams.setdefault(name, _Stream())

    @override
    def publish(self, stream: str, data: bytes, max_len: int | None = None, max_age_ms: int | None = None) -> str:
        with self._cond:
            s = self._stream(stream)
            ms = int(time.time() * 1000)
            last_ms, last_seq = s.last_id
            new = (ms, 0) if ms > last_ms else (last_ms, last_seq + 1)
            s.last_id = new
            entry_id = f"{new[0]}-{new[1]}"
            s.entries[entry_id] = bytes(data)
            bound = max_len if max_len is not None else self.default_max_len
            while bound is not None and len(s.entries) > bound:
                s.entries.popitem(last=False)  # like XADD MAXLEN: trimmed entries vanish, PEL refs dangle
            if max_age_ms is not None:
                min_ms = ms - max_age_ms
                while s.entries and _parse(next(iter(s.entries)))[0] < min_ms:
                    s.entries.popitem(last=False)  # like XTRIM MINID
            self._cond.notify_all()
            return entry_id

    @override
    def ensure_group(self, stream: str, group: str, start: str = "0") -> None:
        with self._cond:
            s = self._stream(stream)
            if group not in s.groups:
                s.groups[group] = _Group(last_id=s.last_id if start == "$" else _parse(start))

    def _read_now(self, group: str, consumer: str, streams: list[str], count: int) -> list[Entry]:
        out: list[Entry] = []
        now = time.monotonic()
        for name in streams:
            s = self._streams.get(name)
            if s is None or group not in s.groups:
                raise KeyError(f"no consumer group {group!r} on stream {name!r}")
            g = s.groups[group]
            for entry_id, data in s.entries.items():
                if len(out) >= count:
                    return out
                if _parse(entry_id) <= g.last_id:
                    continue
                g.last_id = _parse(entry_id)
                g.pending[entry_id] = _Pending(consumer, now, 1)
                out.append(Entry(name, entry_id, data, 1))
        return out

    @override
    def read(self, group: str, consumer: str, streams: list[str], count: int = 100,
             block_ms: int | None = None) -> list[Entry]:
        deadline = None if block_ms is None else time.monotonic() + block_ms / 1000
        with self._cond:
            while True:
                out = self._read_now(group, consumer, streams, count)
                if out or deadline is None:
                    return out
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return out
                self._cond.wait(remaining)

    @override
    def ack(self, stream: str, group: str, entry_ids: list[str]) -> int:
        with self._cond:
            s = self._streams.get(stream)
            if s is None or group not in s.groups:
                return 0
            g = s.groups[group]
            return sum(1 for e in entry_ids if g.pending.pop(e, None) is not None)

    @override
    def claim_idle(self, stream: str, group: str, consumer: str, min_idle_ms: int, count: int = 100) -> list[Entry]:
        with self._cond:
            s = self._streams.get(stream)
            if s is None or group not in s.groups:
                return []
            g = s.groups[group]
            now = time.monotonic()
            out: list[Entry] = []
            for entry_id in list(g.pending):
                if len(out) >= count:
                    break
                p = g.pending[entry_id]
                if (now - p.delivered_at) * 1000 < min_idle_ms:
                    continue
                if entry_id not in s.entries:  # trimmed away: drop the dangling reference (XAUTOCLAIM does too)
                    del g.pending[entry_id]
                    continue
                g.pending[entry_id] = _Pending(consumer, now, p.deliveries + 1)
                out.append(Entry(stream, entry_id, s.entries[entry_id], p.deliveries + 1))
            return out

    @override
    def pending_count(self, stream: str, group: str) -> int:
        with self._cond:
            s = self._streams.get(stream)
            return len(s.groups[group].pending) if s and group in s.groups else 0

    @override
    def length(self, stream: str) -> int:
        with self._cond:
            s = self._streams.get(stream)
            return len(s.entries) if s else 0

    @override
    def recent(self, stream: str, count: int, before: str | None = None) -> list[Entry]:
        with self._cond:
            s = self._streams.get(stream)
            if not s:
                return []
            ids = list(s.entries)
            if before is not None:
                ids = ids[:ids.index(before)] if before in s.entries else [i for i in ids if _parse(i) < _parse(before)]
            ids = ids[-count:][::-1]
            return [Entry(stream, i, s.entries[i], 0) for i in ids]

    @override
    def last(self, stream: str) -> Entry | None:
        with self._cond:
            s = self._streams.get(stream)
            if not s or not s.entries:
                return None
            entry_id = next(reversed(s.entries))
            return Entry(stream, entry_id, s.entries[entry_id], 0)

    @override
    def groups(self, stream: str) -> list[dict]:
        with self._cond:
            s = self._streams.get(stream)
            if s is None:
                return []
            return [
                {"name": name, "pending": len(g.pending), "lag": sum(1 for e in s.entries if _parse(e) > g.last_id)}
                for name, g in s.groups.items()
            ]

    @override
    def streams(self, prefix: str = "") -> list[str]:
        with self._cond:
            return sorted(n for n in self._streams if n.startswith(prefix))
