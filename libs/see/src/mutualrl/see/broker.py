"""The transport contract every SEE backend implements (Redis Streams semantics)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """One raw stream entry as the broker returns it: stream, id and bytes."""
    stream: str
    entry_id: str  # "<ms>-<seq>", monotonically increasing per stream
    data: bytes
    deliveries: int = 1  # how many times this entry was delivered to the group


class Broker(ABC):
    """Append-only streams with consumer groups, modelled on Redis Streams.

    Semantics every backend must honour (the contract tests check them):
    per-stream order; an entry delivered to a group stays *pending* for the
    consumer that read it until acknowledged; pending entries idle for longer
    than ``min_idle_ms`` can be claimed by another consumer; streams are
    trimmed to ``max_len`` entries and ``max_age_ms`` of age (oldest first).
    """

    @abstractmethod
    def publish(self, stream: str, data: bytes, max_len: int | None = None, max_age_ms: int | None = None) -> str:
        """Append; then trim the stream to ``max_len`` entries and drop entries older than ``max_age_ms``."""

    def publish_many(self, stream: str, items: list[bytes], max_len: int | None = None,
                     max_age_ms: int | None = None) -> list[str]:
        """Append several entries (backends override this to use one round trip)."""
        return [self.publish(stream, d, max_len, max_age_ms) for d in items]

    @abstractmethod
    def ensure_group(self, stream: str, group: str, start: str = "0") -> None:
        """Create ``group`` on ``stream`` (and the stream) if missing; ``start="0"`` reads from the beginning."""

    @abstractmethod
    def read(self, group: str, consumer: str, streams: list[str], count: int = 100,
             block_ms: int | None = None) -> list[Entry]:
        """New entries (never delivered to this group) across ``streams``, marking them pending."""

    @abstractmethod
    def ack(self, stream: str, group: str, entry_ids: list[str]) -> int:
        """Acknowledge entries for ``group``; returns how many were pending."""

    @abstractmethod
    def claim_idle(self, stream: str, group: str, consumer: str, min_idle_ms: int, count: int = 100) -> list[Entry]:
        """Take over entries pending for longer than ``min_idle_ms`` (a dead consumer's)."""

    @abstractmethod
    def pending_count(self, stream: str, group: str) -> int:
        """Entries delivered to ``group`` and not acknowledged yet."""

    @abstractmethod
    def length(self, stream: str) -> int:
        """Entries in ``stream``."""

    @abstractmethod
    def streams(self, prefix: str = "") -> list[str]:
        """The streams whose names start with ``prefix``."""

    @abstractmethod
    def last(self, stream: str) -> Entry | None:
        """The newest entry of ``stream`` (no consumer group involved), or None: how services read
        control-plane state (the latest heartbeat or weights version) after a restart."""

    @abstractmethod
    def recent(self, stream: str, count: int, before: str | None = None) -> list[Entry]:
        """Up to ``count`` newest entries of ``stream`` (older than entry id ``before`` when given), newest
        first (no consumer group involved): paging backwards through a stream."""

    @abstractmethod
    def groups(self, stream: str) -> list[dict]:
        """Per consumer group of ``stream``: ``name``, ``pending`` and ``lag`` (entries not yet delivered)."""

    def backlog(self, stream: str) -> int:
        """Entries the slowest group has not finished with (lag + pending): what backpressure bounds."""
        return max((int(g["lag"] or 0) + int(g["pending"]) for g in self.groups(stream)), default=0)

    def close(self) -> None:  # pragma: no cover - default no-op
        """Release the connection (nothing by default)."""
        pass
