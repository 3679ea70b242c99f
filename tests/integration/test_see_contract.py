"""The SEE contract, run against both backends (in-process and a real Redis server started by
the test setup): per-producer order, pending/ack, reclaim after a consumer dies, retention by
length and age, dedup, independent groups, dead letters, backpressure, blocking reads."""

import time

import pytest

from mutualrl.see import (
    Backpressure,
    BackpressureTimeout,
    ExperienceExchange,
    InProcessBroker,
    RedisBroker,
    RedisOptions,
)
from mutualrl.see.exchange import dead_letter_stream, stream_name
from mutualrl.v1 import experience_pb2 as pb


@pytest.fixture(params=["inprocess", "redis"])
def broker(request):
    if request.param == "inprocess":
        yield InProcessBroker()
        return
    server = request.getfixturevalue("redis_server")
    b = RedisBroker(RedisOptions(url=server.url))
    b.r.flushall()
    yield b
    b.close()


@pytest.fixture
def _ex(broker):
    def make(key=None, max_len=None, **kw):
        return ExperienceExchange(broker, "mutualrl:test", keys=key, max_len=max_len, **kw)

    return make


def _stats(i):
    return pb.AdvantageStats(prompt_id=f"p{i}", step=i, count=8, mean=0.5)


def test_per_producer_order_and_typed_payloads(_ex):
    ex = _ex()
    sub = ex.subscribe("b", ["advantage_stats"], ["a"])
    ids = [ex.publish(_stats(i), "a", weights_version=3) for i in range(5)]
    got = sub.poll()
    assert [r.envelope.message_id for r in got] == ids
    assert [r.payload.prompt_id for r in got] == [f"p{i}" for i in range(5)]
    assert all(r.kind == "advantage_stats" for r in got)
    assert all(r.envelope.weights_version == 3 and r.envelope.producer == "a" for r in got)


def test_unacked_messages_stay_pending_and_are_reclaimed_by_another_consumer(_ex):
    ex = _ex()
    dead = ex.subscribe("b", ["advantage_stats"], ["a"], consumer="b-0")
    ex.publish(_stats(1), "a")
    got = dead.poll()
    assert len(got) == 1 and dead.pending() == 1  # received, never acked: the consumer "dies" here
    alive = ex.subscribe("b", ["advantage_stats"], ["a"], consumer="b-1")
    assert alive.poll() == []  # not redelivered as new
    time.sleep(0.05)
    again = alive.reclaim(min_idle_ms=20)
    assert [r.envelope.message_id for r in again] == [got[0].envelope.message_id]
    assert again[0].entry.deliveries == 2
    alive.ack(again)
    assert alive.pending() == 0


def test_redelivered_duplicate_is_counted_once(_ex):
    ex = _ex()
    sub = ex.subscribe("b", ["advantage_stats"], ["a"])
    ex.publish(_stats(1), "a", message_id="fixed-id")
    sub.ack(sub.poll())
    ex.publish(_stats(1), "a", message_id="fixed-id")  # the producer retried after a timeout
    assert sub.poll() == []
    assert sub.counts["duplicate"] == 1 and sub.counts["advantage_stats"] == 1
    assert sub.pending() == 0


def test_retention_bound(_ex):
    ex = _ex(max_len=10)
    for i in range(25):
        ex.publish(_stats(i), "a")
    assert ex.broker.length(stream_name("mutualrl:test", "advantage_stats", "a")) == 10


def test_groups_are_independent_per_receiver(_ex):
    ex = _ex()
    b = ex.subscribe("b", ["advantage_stats"], ["a"])
    c = ex.subscribe("c", ["advantage_stats"], ["a"])
    ex.publish(_stats(1), "a")
    assert len(b.poll()) == 1 and len(c.poll()) == 1


@pytest.mark.parametrize("case", ["garbage", "unknown_schema", "bad_signature", "unsigned"])
def test_broken_messages_go_to_dead_letter_and_the_consumer_keeps_running(_ex, case):
    key = b"secret"
    ex = _ex(key=key)
    sub = ex.subscribe("b", ["advantage_stats"], ["a"])
    stream = stream_name("mutualrl:test", "advantage_stats", "a")
    if case == "garbage":
        ex.broker.publish(stream, b"\xff\x00not a protobuf\x13")
    elif case == "unknown_schema":
        env = ex.codec.wrap(_stats(0), "a")
        env.schema_version = 99
        ex.broker.publish(stream, env.SerializeToString())
    elif case == "bad_signature":
        forged = ExperienceExchange(ex.broker, "mutualrl:test", keys=b"wrong key")
        forged.publish(_stats(0), "a")
    else:
        unsigned = ExperienceExchange(ex.broker, "mutualrl:test", keys=None)
        unsigned.publish(_stats(0), "a")
    good = ex.publish(_stats(1), "a")
    got = sub.poll()
    assert [r.envelope.message_id for r in got] == [good]
    sub.ack(got)
    reason = {"garbage": "decode_error", "unknown_schema": "unknown_schema_version", "bad_signature": "bad_signature",
              "unsigned": "bad_signature"}[case]
    assert sub.counts[f"dead_letter:{reason}"] == 1
    dl = ex.broker.streams(dead_letter_stream("mutualrl:test"))
    assert dl and ex.broker.length(dl[0]) == 1
    assert sub.pending() == 0  # the broken entry was acked, not left to block the group


def test_blocking_read_returns_when_data_arrives(_ex):
    import threading

    ex = _ex()
    sub = ex.subscribe("b", ["advantage_stats"], ["a"])
    timer = threading.Timer(0.05, lambda: ex.publish(_stats(1), "a"))
    timer.start()
    t0 = time.monotonic()
    got = sub.poll(block_ms=2000)
    timer.join()
    assert len(got) == 1 and time.monotonic() - t0 < 1.5


def test_unknown_kind_is_rejected(_ex):
    with pytest.raises(ValueError, match="valid: rollout"):
        _ex().subscribe("b", ["gossip"], ["a"])


def test_retention_by_age(_ex):
    ex = _ex(max_age_ms=150)
    for i in range(5):
        ex.publish(_stats(i), "a")
    time.sleep(0.3)
    ex.publish(_stats(9), "a")  # trimming happens on write: everything older than 150 ms goes
    stream = stream_name("mutualrl:test", "advantage_stats", "a")
    assert ex.broker.length(stream) == 1


def test_publish_many_keeps_order_and_counts(_ex):
    ex = _ex()
    sub = ex.subscribe("b", ["advantage_stats", "rollout"], ["a"])
    ids = ex.publish_many([_stats(i) for i in range(50)] + [pb.Rollout(prompt_id="r")], "a")
    got = sub.poll()
    stats = [r.envelope.message_id for r in got if r.kind == "advantage_stats"]
    assert stats == ids[:50] and ex.published["advantage_stats"] == 50 and ex.published["rollout"] == 1


def test_backpressure_drop_counts_and_block_waits_for_the_receiver(_ex):
    import threading

    drop = _ex(backpressure=Backpressure(max_backlog=3, policy="drop"))
    sub = drop.subscribe("b", ["advantage_stats"], ["a"])
    sent = [drop.publish(_stats(i), "a") for i in range(5)]
    assert sent[3:] == [None, None] and drop.backpressure_events["dropped"] == 2
    got = sub.poll()
    assert len(got) == 3
    assert drop.publish(_stats(9), "a") is None  # delivered but not acked still counts (pending)
    sub.ack(got)
    assert drop.publish(_stats(10), "a") is not None

    block = _ex(backpressure=Backpressure(max_backlog=2, policy="block", block_timeout_s=5))
    blocked_sub = block.subscribe("c", ["rollout"], ["a"])
    block.publish(pb.Rollout(prompt_id="0"), "a")
    block.publish(pb.Rollout(prompt_id="1"), "a")
    timer = threading.Timer(0.2, lambda: blocked_sub.ack(blocked_sub.poll()))
    timer.start()
    t0 = time.monotonic()
    assert block.publish(pb.Rollout(prompt_id="2"), "a") is not None
    timer.join()
    assert time.monotonic() - t0 >= 0.15 and block.backpressure_events["blocked"] == 1
    timeout = _ex(backpressure=Backpressure(max_backlog=1, policy="block", block_timeout_s=0.2))
    timeout.subscribe("d", ["heartbeat"], ["a"])
    timeout.publish(pb.Heartbeat(role="x"), "a")
    with pytest.raises(BackpressureTimeout, match="backlog"):
        timeout.publish(pb.Heartbeat(role="y"), "a")


def test_groups_report_lag_and_pending(_ex):
    ex = _ex()
    sub = ex.subscribe("b", ["advantage_stats"], ["a"])
    for i in range(4):
        ex.publish(_stats(i), "a")
    got = sub.poll(count=1)
    stream = stream_name("mutualrl:test", "advantage_stats", "a")
    (g,) = ex.broker.groups(stream)
    assert g["name"] == "b" and g["pending"] == 1 and g["lag"] == 3
    sub.ack(got)
    assert ex.broker.backlog(stream) == 3


def test_last_returns_the_newest_message(_ex):
    ex = _ex()
    assert ex.last("heartbeat", "a.learner") is None
    for step in (1, 2, 3):
        ex.publish(pb.Heartbeat(role="learner", step=step), "a.learner")
    assert ex.last("heartbeat", "a.learner").payload.step == 3


def test_junk_after_a_control_message_cannot_hide_it(_ex, broker):
    # a valid heartbeat, then entries anyone with write access could append: random bytes, a
    # signed message of the wrong kind, and one claiming another producer. last() returns the
    # valid heartbeat and dead-letters each junk entry once, however often it is asked.
    ex = _ex(key=b"k")
    ex.publish(pb.Heartbeat(role="learner", step=3, version=3, status="ok"), "a.learner")
    stream = stream_name("mutualrl:test", "heartbeat", "a.learner")
    broker.publish(stream, b"\x00garbage", None)
    broker.publish(stream, ex.codec.wrap_encoded(pb.WeightsPublished(policy="a", version=99), "a.learner")[1], None)
    broker.publish(stream, ex.codec.wrap_encoded(pb.Heartbeat(role="learner", step=999), "mallory")[1], None)
    for _ in range(2):
        got = ex.last("heartbeat", "a.learner")
        assert got is not None and got.payload.step == 3
    assert dict(ex.control_dead_lettered) == {"decode_error": 1, "wrong_kind": 1, "wrong_producer": 1}
    assert broker.length(dead_letter_stream("mutualrl:test")) == 3
    ex.publish(pb.Heartbeat(role="learner", step=4, version=4, status="ok"), "a.learner")
    assert ex.last("heartbeat", "a.learner").payload.step == 4


def test_any_number_of_junk_entries_cannot_hide_a_control_message(_ex, broker):
    # more junk than one page of last()'s backwards read (64): it reads on, page by page
    ex = _ex(key=b"k")
    ex.publish(pb.WeightsPublished(policy="a", version=7, checksum="c"), "a.learner")
    stream = stream_name("mutualrl:test", "weights_published", "a.learner")
    for i in range(150):
        broker.publish(stream, b"junk-%d" % i, None)
    got = ex.last("weights_published", "a.learner")
    assert got is not None and got.payload.version == 7
    assert ex.control_dead_lettered["decode_error"] == 150
    assert ex.last("weights_published", "a.learner").payload.version == 7  # the junk is not decoded again
    assert ex.control_dead_lettered["decode_error"] == 150
    assert _ex(key=b"k").last("weights_published", "nobody") is None
