"""The SEE client every worker uses: typed publish, per-receiver subscriptions, dedup, dead letters."""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Iterable

from google.protobuf.message import Message

from mutualrl.see.broker import Broker, Entry
from mutualrl.see.codec import PAYLOAD_KINDS, CodecError, EnvelopeCodec, kind_of
from mutualrl.see.identity import Keyring
from mutualrl.v1 import experience_pb2 as pb

DEAD_LETTER = "deadletter"


def stream_name(namespace: str, kind: str, producer: str) -> str:
    """``<namespace>:<kind>:<producer>`` — one stream per experience type and producer (docs/architecture.md,
    "Messages")."""
    return f"{namespace}:{kind}:{producer}"


def misplacement(env, kind: str, owner: str) -> tuple[str, str] | None:
    """(reason, detail) when a decoded message does not belong on the ``kind`` stream of
    ``owner`` — another kind, or another producer's name (an impersonation) — else None."""
    if env.WhichOneof("payload") != kind:
        return "wrong_kind", f"{env.WhichOneof('payload')} on a {kind} stream"
    if env.producer != owner:
        return "wrong_producer", f"{env.producer!r} on {owner!r}'s stream"
    return None


def dead_letter_stream(namespace: str) -> str:
    """The namespace's dead-letter stream, where receivers move messages they cannot use."""
    return f"{namespace}:{DEAD_LETTER}"


@dataclass(frozen=True)
class Received:
    """A decoded, verified message together with the stream entry it came from (for ack)."""
    envelope: pb.Envelope
    entry: Entry

    @property
    def kind(self) -> str:
        """The payload's kind (``rollout``, ``verified_success``, ...)."""
        return self.envelope.WhichOneof("payload")

    @property
    def payload(self) -> Message:
        """The payload message inside the envelope."""
        return getattr(self.envelope, self.kind)


class BackpressureTimeout(RuntimeError):
    """A ``block`` publisher waited ``block_timeout_s`` and the stream stayed over its bound."""


@dataclass(frozen=True)
class Backpressure:
    """What a publisher does when a stream's backlog (entries the slowest receiver has not
    finished: lag + pending) reaches ``max_backlog``: wait for receivers (``block``, up to
    ``block_timeout_s``, then :class:`BackpressureTimeout`) or skip the message (``drop``).
    Either way it is counted; nothing is trimmed away unread because of it."""

    max_backlog: int
    policy: str = "block"  # block | drop
    block_timeout_s: float = 30.0
    poll_s: float = 0.02

    def __post_init__(self) -> None:
        if self.policy not in ("block", "drop"):
            raise ValueError(f"unknown backpressure policy {self.policy!r}; valid: block, drop")
        if self.max_backlog < 1:
            raise ValueError("backpressure max_backlog must be >= 1")


class ExperienceExchange:
    """Publishes a producer's experience and opens subscriptions for receivers.

    ``namespace`` isolates experiments sharing one broker (``mutualrl:<run>``).
    ``keys``: the signing keys (a :class:`Keyring`, or a run key every service key derives
    from); None publishes and accepts unsigned messages.
    Retention: ``max_len`` entries and/or ``max_age_ms`` per stream.
    """

    def __init__(
        self,
        broker: Broker,
        namespace: str,
        keys: Keyring | bytes | None = None,
        max_len: int | None = None,
        max_age_ms: int | None = None,
        backpressure: Backpressure | None = None,
    ):
        self.broker = broker
        self.namespace = namespace
        self.codec = EnvelopeCodec(keys)
        self.max_len = max_len
        self.max_age_ms = max_age_ms
        self.backpressure = backpressure
        self.published: Counter[str] = Counter()
        self.backpressure_events: Counter[str] = Counter()  # blocked, dropped
        self.subscriptions: list[Subscription] = []
        self.control_dead_lettered: Counter[str] = Counter()  # invalid control entries skipped by last(), by reason
        self._control_rejected: set[tuple[str, str]] = set()
        self._headroom: dict[str, int] = {}  # stream -> publishes allowed before the next backlog check

    def _admit(self, stream: str, n: int) -> bool:
        """Backpressure gate for ``n`` new entries; cheap: the backlog is only queried when the
        last known value plus publishes since could have reached the bound."""
        bp = self.backpressure
        if bp is None:
            return True
        if self._headroom.get(stream, 0) >= n:
            self._headroom[stream] -= n
            return True
        deadline = time.monotonic() + bp.block_timeout_s
        waited = False
        while True:
            backlog = self.broker.backlog(stream)
            if backlog + n <= bp.max_backlog:
                self._headroom[stream] = bp.max_backlog - backlog - n
                if waited:
                    self.backpressure_events["blocked"] += 1
                return True
            if bp.policy == "drop":
                self.backpressure_events["dropped"] += n
                return False
            if time.monotonic() >= deadline:
                self.backpressure_events["timeout"] += 1
                raise BackpressureTimeout(f"stream {stream} stayed at backlog {backlog} >= {bp.max_backlog} for "
                                          f"{bp.block_timeout_s}s")
            waited = True
            time.sleep(bp.poll_s)

    def publish(self, payload: Message, producer: str, weights_version: int = 0,
                message_id: str | None = None) -> str | None:
        """Wrap, sign and append; returns the message id (the receivers' dedup key), or None
        when backpressure dropped the message."""
        kind = kind_of(payload)
        stream = stream_name(self.namespace, kind, producer)
        if not self._admit(stream, 1):
            return None
        mid, data = self.codec.wrap_encoded(payload, producer, weights_version, message_id)
        self.broker.publish(stream, data, self.max_len, self.max_age_ms)
        self.published[kind] += 1
        return mid

    def publish_many(self, payloads: Iterable[Message], producer: str, weights_version: int = 0) -> list[str | None]:
        """Publish several messages, one broker round trip per stream."""
        by_stream: dict[str, list[tuple[int, str, bytes]]] = {}
        ids: list[str | None] = []
        kinds: dict[str, str] = {}
        for i, p in enumerate(payloads):
            mid, data = self.codec.wrap_encoded(p, producer, weights_version)
            kind = kind_of(p)
            stream = stream_name(self.namespace, kind, producer)
            kinds[stream] = kind
            by_stream.setdefault(stream, []).append((i, mid, data))
            ids.append(mid)
        for stream, items in by_stream.items():
            if not self._admit(stream, len(items)):
                for i, _, _ in items:
                    ids[i] = None
                continue
            self.broker.publish_many(stream, [data for _, _, data in items], self.max_len, self.max_age_ms)
            self.published[kinds[stream]] += len(items)
        return ids

    def last(self, kind: str, producer: str, page: int = 64) -> Received | None:
        """The newest *valid* message of a control stream (a heartbeat, a weights announcement):
        it decodes, verifies, carries ``kind`` and was sent by the stream's own ``producer``.
        Newer junk is skipped and dead-lettered once, so no number of appended invalid entries can
        hide the state before them: the stream is read backwards ``page`` entries at a time until a
        valid one (None when it holds none). Junk seen before is skipped without decoding it again."""
        stream = stream_name(self.namespace, kind, producer)
        before = None
        while True:
            entries = self.broker.recent(stream, page, before=before)
            for e in entries:
                if (e.stream, e.entry_id) in self._control_rejected:
                    continue
                try:
                    env = self.codec.decode(e.data)
                except CodecError as err:
                    self._control_dead_letter(e, err.reason, str(err))
                    continue
                misplaced = misplacement(env, kind, producer)
                if misplaced:
                    self._control_dead_letter(e, *misplaced)
                    continue
                return Received(env, e)
            if len(entries) < page:
                return None
            before = entries[-1].entry_id

    def _control_dead_letter(self, e: Entry, reason: str, detail: str) -> None:
        key = (e.stream, e.entry_id)
        if key in self._control_rejected:
            return
        self._control_rejected.add(key)
        record = f"{reason}\x00{e.stream}\x00{e.entry_id}\x00{detail}\x00".encode() + e.data
        self.broker.publish(dead_letter_stream(self.namespace), record, self.max_len)
        self.control_dead_lettered[reason] += 1

    def subscribe(self, receiver: str, kinds: list[str], producers: list[str], consumer: str | None = None,
                  max_deliveries: int = 3) -> "Subscription":
        """A consumer group on the streams of ``kinds`` from ``producers``, for ``receiver``."""
        for k in kinds:
            if k not in PAYLOAD_KINDS:
                raise ValueError(f"unknown experience kind {k!r}; valid: {', '.join(PAYLOAD_KINDS)}")
        streams = [stream_name(self.namespace, k, p) for k in kinds for p in producers]
        sub = Subscription(self, receiver, consumer or f"{receiver}-0", streams, max_deliveries=max_deliveries)
        self.subscriptions.append(sub)
        return sub


class Subscription:
    """One receiver's consumer-group view of a set of streams.

    Messages that fail to decode or validate are moved to the dead-letter stream
    with the reason and acknowledged, so one broken message never blocks the
    consumer. Messages already seen (by id) are acknowledged and skipped: the
    broker delivers at least once, the receiver counts each message once.
    """

    def __init__(self, exchange: ExperienceExchange, receiver: str, consumer: str, streams: list[str],
                 dedup_window: int = 100_000,
                 max_deliveries: int = 3):
        self.max_deliveries = max_deliveries  # a message re-adopted more often than this is a poison pill
        self.ex = exchange
        self.group = receiver
        self.consumer = consumer
        self.streams = streams
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._dedup_window = dedup_window
        self.counts: Counter[str] = Counter()
        for s in streams:
            exchange.broker.ensure_group(s, self.group, start="0")

    def _accept(self, entries: list[Entry]) -> list[Received]:
        """Decoded, verified entries; a message is accepted only from the producer that owns
        the stream it came on and only of that stream's kind — a valid signature on someone
        else's stream is an impersonation, not experience."""
        out: list[Received] = []
        prefix = len(self.ex.namespace) + 1
        for e in entries:
            try:
                env = self.ex.codec.decode(e.data)
            except CodecError as err:
                self._dead_letter(e, err.reason, str(err))
                continue
            kind, _, owner = e.stream[prefix:].partition(":")
            misplaced = misplacement(env, kind, owner)
            if misplaced:
                self._dead_letter(e, *misplaced)
                continue
            if env.message_id in self._seen:
                self.counts["duplicate"] += 1
                self.ex.broker.ack(e.stream, self.group, [e.entry_id])
                continue
            out.append(Received(env, e))
        return out

    def _dead_letter(self, e: Entry, reason: str, detail: str) -> None:
        # The dead-letter record keeps the reason, the origin and the original bytes for inspection.
        record = f"{reason}\x00{e.stream}\x00{e.entry_id}\x00{detail}\x00".encode() + e.data
        self.ex.broker.publish(dead_letter_stream(self.ex.namespace), record, self.ex.max_len)
        self.ex.broker.ack(e.stream, self.group, [e.entry_id])
        self.counts[f"dead_letter:{reason}"] += 1

    def refuse(self, received: Iterable[Received], reason: str, detail: str = "") -> None:
        """Messages that decoded and verified but that the receiver will not use (a malformed or conflicting
        rollout): moved to the dead-letter stream with ``reason``, acknowledged and remembered, counted as
        ``dead_letter:<reason>``."""
        for r in received:
            self._dead_letter(r.entry, reason, detail)
            self._seen[r.envelope.message_id] = None

    def poll(self, count: int = 1000, block_ms: int | None = None) -> list[Received]:
        """New messages (decoded, validated, not seen before). Call :meth:`ack` after using them."""
        if not self.streams:
            return []
        return self._accept(self.ex.broker.read(self.group, self.consumer, self.streams, count, block_ms))

    def reclaim(self, min_idle_ms: int, count: int = 1000) -> list[Received]:
        """Take over entries a dead consumer of this group left pending."""
        entries: list[Entry] = []
        for s in self.streams:
            entries += self.ex.broker.claim_idle(s, self.group, self.consumer, min_idle_ms, count)
        # A message whose processing crashed the receiver comes back here after every restart;
        # past max_deliveries it is dead-lettered instead of crashing the receiver forever.
        poison = [e for e in entries if e.deliveries > self.max_deliveries]
        for e in poison:
            self._dead_letter(e, "poison_pill", f"delivered {e.deliveries} times without being acknowledged")
        return self._accept([e for e in entries if e.deliveries <= self.max_deliveries])

    def ack(self, received: Iterable[Received]) -> None:
        """Acknowledge what was used: never delivered again, and remembered for de-duplication."""
        by_stream: dict[str, list[str]] = {}
        for r in received:
            by_stream.setdefault(r.entry.stream, []).append(r.entry.entry_id)
            self._seen[r.envelope.message_id] = None
            self.counts[r.kind] += 1
        for stream, ids in by_stream.items():  # one XACK per stream
            self.ex.broker.ack(stream, self.group, ids)
        while len(self._seen) > self._dedup_window:
            self._seen.popitem(last=False)

    def pending(self) -> int:
        """Entries delivered to this subscription and not acknowledged yet."""
        return sum(self.ex.broker.pending_count(s, self.group) for s in self.streams)
