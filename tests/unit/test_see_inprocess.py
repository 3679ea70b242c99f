"""SEE semantics on the in-process backend: order, pending/ack, reclaim, retention, dedup, dead letters."""

import time

import pytest

from mutualrl.see import ExperienceExchange, InProcessBroker
from mutualrl.see.exchange import dead_letter_stream, stream_name
from mutualrl.v1 import experience_pb2 as pb


def _ex(key=None, max_len=None):
    return ExperienceExchange(InProcessBroker(), "mutualrl:test", hmac_key=key, max_len=max_len)


def _stats(i):
    return pb.AdvantageStats(prompt_id=f"p{i}", step=i, count=8, mean=0.5)


def test_per_producer_order_and_typed_payloads():
    ex = _ex()
    sub = ex.subscribe("b", ["advantage_stats"], ["a"])
    ids = [ex.publish(_stats(i), "a", weights_version=3) for i in range(5)]
    got = sub.poll()
    assert [r.envelope.message_id for r in got] == ids
    assert [r.payload.prompt_id for r in got] == [f"p{i}" for i in range(5)]
    assert all(r.kind == "advantage_stats" and r.envelope.weights_version == 3 and r.envelope.producer == "a" for r in got)


def test_unacked_messages_stay_pending_and_are_reclaimed_by_another_consumer():
    ex = _ex()
    dead = ex.subscribe("b", ["advantage_stats"], ["a"], consumer="b-0")
    ex.publish(_stats(1), "a")
    got = dead.poll()
    assert len(got) == 1 and dead.pending() == 1  # received, never acked: the consumer "dies" here
    alive = ex.subscribe("b", ["advantage_stats"], ["a"], consumer="b-1")
    assert alive.poll() == []  # not redelivered as new
    time.sleep(0.02)
    again = alive.reclaim(min_idle_ms=10)
    assert [r.envelope.message_id for r in again] == [got[0].envelope.message_id]
    assert again[0].entry.deliveries == 2
    alive.ack(again)
    assert alive.pending() == 0


def test_redelivered_duplicate_is_counted_once():
    ex = _ex()
    sub = ex.subscribe("b", ["advantage_stats"], ["a"])
    ex.publish(_stats(1), "a", message_id="fixed-id")
    sub.ack(sub.poll())
    ex.publish(_stats(1), "a", message_id="fixed-id")  # the producer retried after a timeout
    assert sub.poll() == []
    assert sub.counts["duplicate"] == 1 and sub.counts["advantage_stats"] == 1
    assert sub.pending() == 0


def test_retention_bound():
    ex = _ex(max_len=10)
    for i in range(25):
        ex.publish(_stats(i), "a")
    assert ex.broker.length(stream_name("mutualrl:test", "advantage_stats", "a")) == 10


def test_groups_are_independent_per_receiver():
    ex = _ex()
    b = ex.subscribe("b", ["advantage_stats"], ["a"])
    c = ex.subscribe("c", ["advantage_stats"], ["a"])
    ex.publish(_stats(1), "a")
    assert len(b.poll()) == 1 and len(c.poll()) == 1


@pytest.mark.parametrize("case", ["garbage", "unknown_schema", "bad_signature", "unsigned"])
def test_broken_messages_go_to_dead_letter_and_the_consumer_keeps_running(case):
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
        forged = ExperienceExchange(ex.broker, "mutualrl:test", hmac_key=b"wrong key")
        forged.publish(_stats(0), "a")
    else:
        unsigned = ExperienceExchange(ex.broker, "mutualrl:test", hmac_key=None)
        unsigned.publish(_stats(0), "a")
    good = ex.publish(_stats(1), "a")
    got = sub.poll()
    assert [r.envelope.message_id for r in got] == [good]
    sub.ack(got)
    reason = {"garbage": "decode_error", "unknown_schema": "unknown_schema_version", "bad_signature": "bad_signature", "unsigned": "bad_signature"}[case]
    assert sub.counts[f"dead_letter:{reason}"] == 1
    dl = ex.broker.streams(dead_letter_stream("mutualrl:test"))
    assert dl and ex.broker.length(dl[0]) == 1
    assert sub.pending() == 0  # the broken entry was acked, not left to block the group


def test_blocking_read_returns_when_data_arrives():
    import threading

    ex = _ex()
    sub = ex.subscribe("b", ["advantage_stats"], ["a"])
    threading.Timer(0.05, lambda: ex.publish(_stats(1), "a")).start()
    t0 = time.monotonic()
    got = sub.poll(block_ms=2000)
    assert len(got) == 1 and time.monotonic() - t0 < 1.5


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="valid: rollout"):
        _ex().subscribe("b", ["gossip"], ["a"])


def test_weight_store_directory_roundtrip_and_cleanup(tmp_path):
    import torch

    from mutualrl.services.rollout import WeightStore

    store = WeightStore(tmp_path, keep=2)
    w = torch.randn(3, 3)
    state = {"embed.weight": w, "lm_head.weight": w}  # tied: the same tensor twice
    uris = [store.put("a", v, state)[0] for v in (1, 2, 3)]
    uri, checksum = store.put("a", 4, state)
    got = store.get(uri, checksum)
    assert torch.equal(got["lm_head.weight"], w)
    store.acknowledge("a", 4)
    assert not any((tmp_path / "a" / f"v{v}").exists() for v in (1, 2))
    assert (tmp_path / "a" / "v3").exists() and (tmp_path / "a" / "v4").exists()
    with pytest.raises(ValueError, match="checksum"):
        store.get(uri, "0" * 64)
    with pytest.raises(FileNotFoundError):
        store.get(uris[0])
