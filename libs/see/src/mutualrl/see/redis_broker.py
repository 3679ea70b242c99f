"""SEE on Redis Streams (redis-py): the durable backend the services share.

One stream per experience kind and producer; one consumer group per receiving
policy; ``XADD`` with exact ``MAXLEN`` (and ``MINID`` for age) retention,
``XREADGROUP`` for delivery, ``XACK`` after use, ``XAUTOCLAIM`` to take over a
dead consumer's pending entries. Connection failures are retried with
exponential backoff (redis-py's ``Retry``), and a consumer group that vanished
with a non-persistent server restart is re-created instead of failing the
reader. Authentication (password or ACL user) and TLS are plain options.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from typing_extensions import override

from mutualrl.see.broker import Broker, Entry

FIELD = b"d"
"""Each stream entry holds one field: the encoded envelope."""


@dataclass(frozen=True)
class RedisOptions:
    """How to reach Redis: URL, credentials, TLS and retry behaviour."""
    url: str = "redis://127.0.0.1:6379/0"
    username: str | None = None  # ACL user (Redis 6+); None = the default user
    password: str | None = None
    tls: bool = False  # also implied by a rediss:// URL
    tls_ca_certs: str | None = None
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    socket_timeout_s: float = 10.0
    retries: int = 30  # reconnect attempts per command before the error surfaces
    backoff_cap_s: float = 2.0
    backoff_base_s: float = 0.05


def connect(opts: RedisOptions) -> redis.Redis:
    """A Redis client with the options' credentials, timeouts and TLS."""
    kwargs: dict = {
        "username": opts.username,
        "password": opts.password,
        "socket_timeout": opts.socket_timeout_s,
        "socket_connect_timeout": opts.socket_timeout_s,
        "retry": Retry(ExponentialBackoff(cap=opts.backoff_cap_s, base=opts.backoff_base_s), opts.retries),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError, ConnectionResetError, BrokenPipeError],
        "health_check_interval": 30,
    }
    if opts.tls and not opts.url.startswith("rediss://"):
        kwargs["ssl"] = True
    if opts.tls or opts.url.startswith("rediss://"):
        kwargs.update(ssl_ca_certs=opts.tls_ca_certs, ssl_certfile=opts.tls_certfile, ssl_keyfile=opts.tls_keyfile)
    return redis.Redis.from_url(opts.url, **{k: v for k, v in kwargs.items() if v is not None})


def _id(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


class RedisBroker(Broker):
    """The SEE broker on Redis Streams: consumer groups, acks, retries across restarts."""
    def __init__(self, options: RedisOptions | None = None, client: redis.Redis | None = None,
                 default_max_len: int | None = None):
        self.options = options or RedisOptions()
        self.r = client or connect(self.options)
        self.default_max_len = default_max_len
        # (stream, group, start) we created, to re-create after a restart
        self._groups: set[tuple[str, str, str]] = set()

    # ---- writing ---------------------------------------------------------
    def _xadd(self, pipe, stream: str, data: bytes, max_len: int | None, max_age_ms: int | None) -> None:
        bound = max_len if max_len is not None else self.default_max_len
        pipe.xadd(stream, {FIELD: data}, maxlen=bound, approximate=False)
        if max_age_ms is not None:
            pipe.xtrim(stream, minid=f"{int(time.time() * 1000) - max_age_ms}-0", approximate=False)

    @override
    def publish(self, stream: str, data: bytes, max_len: int | None = None, max_age_ms: int | None = None) -> str:
        pipe = self.r.pipeline(transaction=False)
        self._xadd(pipe, stream, data, max_len, max_age_ms)
        return _id(pipe.execute()[0])

    def publish_many(self, stream: str, items: list[bytes], max_len: int | None = None,
                     max_age_ms: int | None = None) -> list[str]:
        """One round trip for many entries (what makes SEE competitive with raw pipelined XADD)."""
        pipe = self.r.pipeline(transaction=False)
        for data in items:
            self._xadd(pipe, stream, data, max_len, None)
        if max_age_ms is not None and items:
            pipe.xtrim(stream, minid=f"{int(time.time() * 1000) - max_age_ms}-0", approximate=False)
        res = pipe.execute()
        return [_id(x) for x in res[: len(items)]]

    # ---- groups and reading ------------------------------------------------
    @override
    def ensure_group(self, stream: str, group: str, start: str = "0") -> None:
        try:
            self.r.xgroup_create(stream, group, id=start, mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        self._groups.add((stream, group, start))

    def _recreate_groups(self, streams: list[str], group: str) -> None:
        for s, g, start in list(self._groups):
            if g == group and s in streams:
                self.ensure_group(s, g, start)

    @override
    def read(self, group: str, consumer: str, streams: list[str], count: int = 100,
             block_ms: int | None = None) -> list[Entry]:
        try:
            res = self.r.xreadgroup(group, consumer, {s: ">" for s in streams}, count=count, block=block_ms)
        except redis.ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
            self._recreate_groups(streams, group)  # the server lost its state (restart without persistence)
            res = self.r.xreadgroup(group, consumer, {s: ">" for s in streams}, count=count, block=block_ms)
        out: list[Entry] = []
        for stream, entries in res or []:
            name = _id(stream)
            for entry_id, fields in entries:
                if fields is None:
                    continue  # trimmed between delivery and read
                out.append(Entry(name, _id(entry_id), fields.get(FIELD, b""), 1))
        return out

    @override
    def ack(self, stream: str, group: str, entry_ids: list[str]) -> int:
        if not entry_ids:
            return 0
        return int(self.r.xack(stream, group, *entry_ids))

    @override
    def claim_idle(self, stream: str, group: str, consumer: str, min_idle_ms: int, count: int = 100) -> list[Entry]:
        try:
            res = self.r.xautoclaim(stream, group, consumer, min_idle_ms, start_id="0-0", count=count)
        except redis.ResponseError as e:
            if "NOGROUP" in str(e):
                return []
            raise
        claimed = [(entry_id, fields) for entry_id, fields in res[1] if fields]
        if not claimed:
            return []
        counts = {
            _id(p["message_id"]): int(p["times_delivered"])
            for p in self.r.xpending_range(stream, group, min=_id(claimed[0][0]), max=_id(claimed[-1][0]),
                                           count=len(claimed) * 2 + 10)
        }
        return [Entry(stream, _id(i), f.get(FIELD, b""), counts.get(_id(i), 2)) for i, f in claimed]

    # ---- inspection --------------------------------------------------------
    @override
    def pending_count(self, stream: str, group: str) -> int:
        try:
            return int(self.r.xpending(stream, group)["pending"])
        except redis.ResponseError:
            return 0

    @override
    def length(self, stream: str) -> int:
        return int(self.r.xlen(stream))

    @override
    def streams(self, prefix: str = "") -> list[str]:
        return sorted(_id(k) for k in self.r.scan_iter(match=f"{prefix}*", _type="STREAM", count=1000))

    @override
    def recent(self, stream: str, count: int, before: str | None = None) -> list[Entry]:
        top = f"({before}" if before else "+"  # an exclusive bound (Redis 6.2+)
        return [Entry(stream, _id(i), f.get(FIELD, b""), 0) for i, f in self.r.xrevrange(stream, max=top,
                                                                                          count=count)]

    @override
    def last(self, stream: str) -> Entry | None:
        res = self.r.xrevrange(stream, count=1)
        if not res:
            return None
        entry_id, fields = res[0]
        return Entry(stream, _id(entry_id), fields.get(FIELD, b""), 0)

    def groups(self, stream: str) -> list[dict]:
        """Per group: name, pending, lag (entries not yet delivered; None when the server cannot tell)."""
        try:
            info = self.r.xinfo_groups(stream)
        except redis.ResponseError:
            return []
        return [{"name": _id(g["name"]), "pending": int(g["pending"]), "lag": g.get("lag")} for g in info]

    def ping(self) -> bool:
        """Whether the server answers."""
        return bool(self.r.ping())

    @override
    def close(self) -> None:
        self.r.close()
