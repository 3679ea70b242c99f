"""SEE on a real Redis server: throughput against raw redis-py, and publish→deliver latency.

1. Throughput: N 2 KB ``Rollout`` messages published and consumed (read + ack) through SEE
   (envelope, HMAC signature, decode/verify, dedup), against raw redis-py pipelined
   XADD + XREADGROUP + XACK of the same encoded bytes, in the same run. Goal: ratio >= 0.5.
2. Latency: one message per millisecond (1,000 messages/s) published one by one, received
   by a consumer blocking on the stream; latency = receive time − the envelope's creation
   time. Goal: p99 < 5 ms on loopback.

    .venv/bin/python benchmarks/bench_see.py [--n 20000] [--batch 500] [--rate 1000] [--seconds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import redis

from mutualrl.see import ExperienceExchange, RedisBroker, RedisOptions
from mutualrl.see.acl import ServiceUser, acl_file
from mutualrl.see.identity import Keyring, keys_for_service
from mutualrl.see.server import RedisServer
from mutualrl.v1 import experience_pb2 as pb


def rollout(i: int) -> pb.Rollout:
    return pb.Rollout(
        prompt_id=f"p{i % 64}", prompt_text="Q: 12+34=", completion_text="x" * 1200, token_ids=list(range(150)),
        logprobs=[-0.5] * 150, reward=1.0, step=i // 512, sample_index=i % 8, group_size=8,
        tokenizer_fingerprint="f" * 16,
    )


def raw_roundtrip(r: redis.Redis, stream: str, blobs: list[bytes], batch: int) -> float:
    r.delete(stream)
    r.xgroup_create(stream, "g", id="0", mkstream=True)
    t0 = time.perf_counter()
    for i in range(0, len(blobs), batch):
        pipe = r.pipeline(transaction=False)
        for b in blobs[i : i + batch]:
            pipe.xadd(stream, {b"d": b})
        pipe.execute()
    got = 0
    while got < len(blobs):
        res = r.xreadgroup("g", "c", {stream: ">"}, count=batch)
        ids = [eid for _, entries in res for eid, _ in entries]
        r.xack(stream, "g", *ids)
        got += len(ids)
    return time.perf_counter() - t0


RUN_KEY = "bench-run-key"
# the producer holds its own key (and its learner's)
PUB_KEYS = Keyring(keys_for_service(RUN_KEY, "a", "rollout", ["a", "b"]))
# the receiver: every rollout service's, to verify
RECV_KEYS = Keyring(keys_for_service(RUN_KEY, "b", "learner", ["a", "b"]))


def see_roundtrip(url: str, n: int, batch: int, namespace: str | None = None,
                  pub_user: ServiceUser | None = None, recv_user: ServiceUser | None = None) -> float:
    def opts(u: ServiceUser | None) -> RedisOptions:
        return RedisOptions(url=url, username=u.name if u else None, password=u.password if u else None)

    pub = ExperienceExchange(RedisBroker(opts(pub_user)), namespace or f"bench:{time.time_ns()}", keys=PUB_KEYS)
    recv = ExperienceExchange(RedisBroker(opts(recv_user)), pub.namespace, keys=RECV_KEYS)
    sub = recv.subscribe("b", ["rollout"], ["a"])
    msgs = [rollout(i) for i in range(n)]  # the producer's data exists before SEE is involved
    t0 = time.perf_counter()
    for i in range(0, n, batch):
        pub.publish_many(msgs[i : i + batch], "a")
    got = 0
    while got < n:
        rs = sub.poll(count=batch)
        sub.ack(rs)
        got += len(rs)
    return time.perf_counter() - t0


def _consume(url: str, namespace: str, key: bytes, total: int, ready, out) -> None:
    """The receiver runs in its own process, as a learner would (no GIL shared with the publisher)."""
    recv = ExperienceExchange(RedisBroker(RedisOptions(url=url)), namespace, keys=key)
    sub = recv.subscribe("b", ["rollout"], ["a"])
    ready.set()
    lat: list[float] = []
    deadline = time.monotonic() + 60
    while len(lat) < total and time.monotonic() < deadline:
        got = sub.poll(count=100, block_ms=100)
        now = time.time_ns()
        lat += [(now - r.envelope.created_unix_nanos) / 1e6 for r in got]
        sub.ack(got)
    out.put(lat)


def latency(url: str, rate: int, seconds: float, key: bytes) -> list[float]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    namespace = f"lat:{time.time_ns()}"
    total = int(rate * seconds)
    ready, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_consume, args=(url, namespace, key, total, ready, out))
    proc.start()
    ready.wait(60)
    pub = ExperienceExchange(RedisBroker(RedisOptions(url=url)), namespace, keys=key)
    msg = rollout(0)
    start = time.perf_counter()
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        pub.publish(msg, "a")
    lat = out.get(timeout=90)
    proc.join(timeout=10)
    return lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    key = b"bench-hmac-key"
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url)
        probe = ExperienceExchange(RedisBroker(RedisOptions(url=server.url)), "size", keys=key)
        blobs = [probe.codec.encode(probe.codec.wrap(rollout(i), "a", 0)) for i in range(args.n)]
        print(f"server {server.binary} on port {server.port}; {args.n} messages of "
              f"{statistics.fmean(map(len, blobs)):.0f} bytes, batches of {args.batch}")
        # interleaved, best of 5 each: on 2 shared cores single runs vary by ±15 %
        raws, sees = [], []
        for _ in range(5):
            raws.append(raw_roundtrip(r, "raw", blobs, args.batch))
            sees.append(see_roundtrip(server.url, args.n, args.batch))
        raw, see = min(raws), min(sees)
        print(f"raw redis-py XADD+XREADGROUP+XACK: {args.n / raw:9.0f} msg/s")
        print(f"SEE publish_many+poll+ack (per-producer HMAC keys): {args.n / see:9.0f} msg/s")
        print(f"throughput ratio SEE/raw: {raw / see:.2f} (goal >= 0.5)")
        # the same through a Redis that enforces per-service ACL users (selectors on every XADD)
        # and receivers that check each message's producer against its stream
        users = [ServiceUser("a", "rollout", "pw-a"), ServiceUser("b", "learner", "pw-b")]
        with tempfile.TemporaryDirectory() as tmp:
            acl = Path(tmp) / "users.acl"
            acl.write_text(acl_file("bench-acl", users, "admin"))
            with RedisServer(password="admin", aclfile=str(acl)) as secured:
                url = f"redis://127.0.0.1:{secured.port}/0"
                see_acl = min(see_roundtrip(url, args.n, args.batch, "bench-acl", *users) for _ in range(5))
        print(f"SEE with ACL users + producer check:{args.n / see_acl:9.0f} msg/s")
        print(f"throughput ratio SEE(ACL)/raw: {raw / see_acl:.2f} (goal >= 0.5)")
        lat = sorted(latency(server.url, args.rate, args.seconds, key))
        q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]  # noqa: E731
        print(f"latency at {args.rate} msg/s over {len(lat)} messages: p50 {q(0.5):.2f} ms, p99 {q(0.99):.2f} ms, max "
              f"{lat[-1]:.2f} ms (goal p99 < 5 ms)")


if __name__ == "__main__":
    main()
