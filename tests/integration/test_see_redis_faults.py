"""SEE on a real Redis server that crashes mid-stream: publishers and consumers reconnect and
carry on; every message whose publish returned is delivered, and counted exactly once."""

import threading
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from mutualrl.see import ExperienceExchange, RedisBroker, RedisOptions, SeeCollector
from mutualrl.see.server import RedisServer
from mutualrl.v1 import experience_pb2 as pb


def _exchange(url: str) -> ExperienceExchange:
    return ExperienceExchange(RedisBroker(RedisOptions(url=url, retries=60, backoff_cap_s=0.5)), "mutualrl:fault")


def test_restart_mid_stream_loses_nothing_and_counts_once():
    server = RedisServer(persistent=True).start()
    try:
        pub = _exchange(server.url)
        recv = _exchange(server.url)
        sub = recv.subscribe("b", ["rollout"], ["a"], consumer="b-0")
        published: list[str] = []
        counted: dict[str, int] = {}
        producer_done = threading.Event()
        errors: list[BaseException] = []

        def produce():
            try:
                for i in range(300):
                    published.append(pub.publish(pb.Rollout(prompt_id=f"p{i}", completion_text="x" * 200), "a"))
                    time.sleep(0.004)
            except BaseException as e:  # noqa: BLE001 - surfaced by the assertion below
                errors.append(e)
            finally:
                producer_done.set()

        def consume():
            deadline = time.monotonic() + 60
            try:
                while time.monotonic() < deadline:
                    # entries delivered just before the crash whose reply was lost stay pending
                    # for this consumer: reclaim them after an idle timeout
                    got = sub.poll(block_ms=100) + sub.reclaim(min_idle_ms=1500)
                    for r in got:
                        counted[r.envelope.message_id] = counted.get(r.envelope.message_id, 0) + 1
                    sub.ack(got)
                    if producer_done.is_set() and set(published) <= set(counted):
                        return
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
        for t in threads:
            t.start()
        time.sleep(0.4)  # mid-stream
        server.restart(down_s=0.8)  # SIGKILL, then the same port and data directory
        for t in threads:
            t.join(timeout=90)
        assert not errors, errors
        assert len(published) == 300
        assert set(published) <= set(counted), f"lost {len(set(published) - set(counted))} messages"
        assert all(n == 1 for n in counted.values())  # redeliveries were deduplicated
        assert sub.pending() == 0

        # the broker's state is visible as Prometheus metrics
        reg = CollectorRegistry()
        reg.register(SeeCollector(recv))
        text = generate_latest(reg).decode()
        assert 'mutualrl_see_stream_length{stream="mutualrl:fault:rollout:a"}' in text
        assert 'mutualrl_see_pending{group="b",stream="mutualrl:fault:rollout:a"} 0.0' in text
        assert 'mutualrl_see_consumed_total{kind="rollout",namespace="mutualrl:fault",receiver="b"} 300.0' in text
        assert 'mutualrl_see_broker_up{namespace="mutualrl:fault"} 1.0' in text
    finally:
        server.cleanup()


def test_consumer_group_lost_by_a_non_persistent_restart_is_recreated():
    server = RedisServer(persistent=False).start()
    try:
        ex = _exchange(server.url)
        sub = ex.subscribe("b", ["heartbeat"], ["a"])
        ex.publish(pb.Heartbeat(role="x"), "a")
        sub.ack(sub.poll())
        server.restart(down_s=0.2)  # all state gone, the group too
        ex.publish(pb.Heartbeat(role="y"), "a")
        got = sub.poll(block_ms=500)
        assert [r.payload.role for r in got] == ["y"]
    finally:
        server.cleanup()


def test_password_is_required_and_used():
    server = RedisServer(password="s3cret").start()
    try:
        import redis

        with pytest.raises(redis.AuthenticationError):
            RedisBroker(RedisOptions(url=f"redis://127.0.0.1:{server.port}/0", retries=0)).ping()
        ok = RedisBroker(RedisOptions(url=f"redis://127.0.0.1:{server.port}/0", password="s3cret"))
        assert ok.ping()
    finally:
        server.cleanup()
