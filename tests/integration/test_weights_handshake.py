"""The weights handshake, both halves driven directly: a :class:`WeightsPublisher` (the learner's)
and a :class:`WeightsFollower` (the rollout side's) over a real SEE exchange, with each transport —
``filesystem`` (a directory of versions) and ``collective`` (a real gloo group on loopback): every
version loaded once and acknowledged, a restarted learner continuing after its newest version, a
rollout side that missed a broadcast asking once and being answered, and a version whose learner
died before sending it given up once a newer one is announced."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from mutualrl.see import ExperienceExchange, InProcessBroker, stream_name
from mutualrl.see.server import free_port
from mutualrl.v1 import experience_pb2 as pb
from mutualrl.weights import WeightStore, hf_receiver, hf_sender
from mutualrl.weights.handshake import AWAITING_WEIGHTS, WeightsFollower, WeightsPublisher

POLICY = "p"


class Engine:
    """What a rollout engine does with a version: take it from the transport, then serve it."""

    def __init__(self, receiver):
        self.receiver = receiver
        self.version = 0
        self.state: dict | None = None
        self.loads = 0

    def load(self, version, uri, checksum, manifest) -> None:
        state = self.receiver.get(uri, checksum, manifest)
        self.state, self.version = state, version
        self.loads += 1


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(8, 4, generator=g), "b": torch.randn(3, generator=g).to(torch.bfloat16)}


def _heartbeat(ex: ExperienceExchange, step: int, version: int) -> None:
    """The learner's heartbeat after a step (a collective version is sent once it appears)."""
    ex.publish(pb.Heartbeat(role="learner", step=step, version=version, status="ok"), f"{POLICY}.learner")


def _wait(pred, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture(params=["filesystem", "collective"])
def transport(request, tmp_path):
    """(kind, sender, receiver factory): a restarted rollout side gets a receiver of its own."""
    if request.param == "filesystem":
        store = WeightStore(tmp_path / "weights")
        return request.param, store, lambda newest=None: store
    port = free_port()
    return request.param, hf_sender("127.0.0.1", port, timeout_s=60), lambda newest=None: hf_receiver("127.0.0.1", port,
        timeout_s=60, newest=newest)


def _follower(ex, kind, receiver, engine, **kw) -> WeightsFollower:
    return WeightsFollower(POLICY, ex, receiver, engine.load, lambda: engine.version, collective=kind == "collective",
                           **kw)


def _publish(ex, publisher: WeightsPublisher, step: int, state) -> int:
    version = publisher.publish(step, state)
    _heartbeat(ex, step, version)
    return version


def test_every_version_is_loaded_once_and_acknowledged(transport, tmp_path):
    kind, sender, receiver_for = transport
    ex = ExperienceExchange(InProcessBroker(), "mutualrl:hs")
    receiver = receiver_for()
    engine = Engine(receiver)
    loaded: list[int] = []
    follower = _follower(ex, kind, receiver, engine, on_loaded=loaded.append)
    stop = threading.Event()
    follower.follow(stop)
    publisher = WeightsPublisher(POLICY, ex, sender)
    try:
        for step in (1, 2, 3):
            assert _publish(ex, publisher, step, _state(step)) == step
            _wait(lambda: follower.caught_up() and loaded[-1:] == [step])  # served, then reported
    finally:
        stop.set()
    assert loaded == [1, 2, 3] and engine.loads == 3  # once each, in order
    assert torch.equal(engine.state["w"], _state(3)["w"]) and torch.equal(engine.state["b"], _state(3)["b"])
    follower.load_newest()  # nothing new: nothing loaded again
    assert engine.loads == 3
    if kind == "filesystem":  # acknowledged: versions older than the last two are gone
        assert sorted(d.name for d in (tmp_path / "weights" / POLICY).iterdir()) == ["v2", "v3"]


def test_a_restarted_learner_continues_after_its_newest_announced_version(transport):
    kind, sender, receiver_for = transport
    ex = ExperienceExchange(InProcessBroker(), "mutualrl:hs")
    receiver = receiver_for()
    engine = Engine(receiver)
    follower = _follower(ex, kind, receiver, engine)
    stop = threading.Event()
    follower.follow(stop)
    try:
        first = WeightsPublisher(POLICY, ex, sender)
        for step in (1, 2):
            _publish(ex, first, step, _state(step))
            _wait(follower.caught_up)
        restarted = WeightsPublisher(POLICY, ex, sender)
        restarted.version = 1  # its checkpoint is of step 1; the rollout side already serves version 2
        assert restarted.continue_after() == 2
        assert _publish(ex, restarted, 2, _state(20)) == 3  # never version 2 again
        _wait(follower.caught_up)
    finally:
        stop.set()
    assert engine.version == 3 and torch.equal(engine.state["w"], _state(20)["w"])


def test_a_rollout_side_that_missed_a_broadcast_asks_once_and_is_answered():
    port = free_port()
    sender = hf_sender("127.0.0.1", port, timeout_s=60)
    ex = ExperienceExchange(InProcessBroker(), "mutualrl:hs")
    publisher = WeightsPublisher(POLICY, ex, sender)
    first = Engine(hf_receiver("127.0.0.1", port, timeout_s=60))
    stop = threading.Event()
    _follower(ex, "collective", first.receiver, first).follow(stop)
    _publish(ex, publisher, 1, _state(1))
    _wait(lambda: first.version == 1)
    stop.set()  # that rollout service dies; its replacement starts after version 1 was sent
    ex.publish(pb.Heartbeat(role="rollout", step=1, version=1, status="ok"), f"{POLICY}.rollout")
    assert not publisher.asked_again()

    engine = Engine(hf_receiver("127.0.0.1", port, timeout_s=60))
    follower = _follower(ex, "collective", engine.receiver, engine)
    follower.load_newest()
    follower.load_newest()  # asked once per missed version
    asks = ex.broker.recent(stream_name("mutualrl:hs", "heartbeat", f"{POLICY}.rollout"), 10)
    hb = ex.last("heartbeat", f"{POLICY}.rollout")
    assert hb.payload.status == AWAITING_WEIGHTS and hb.payload.step == 1 and hb.payload.version == 0
    assert len(asks) == 2  # the first service's "ok" and one request
    assert engine.version == 0 and not follower.caught_up()  # it samples nothing meanwhile

    assert publisher.asked_again()
    stop2 = threading.Event()
    follower.follow(stop2)
    try:
        _publish(ex, publisher, 1, _state(11))  # the current weights, as a new version
        _wait(follower.caught_up)
    finally:
        stop2.set()
    assert engine.version == 2 and torch.equal(engine.state["w"], _state(11)["w"])
    assert not publisher.asked_again()  # answered: the request is older than the newest announcement


def test_a_version_whose_learner_died_before_sending_it_is_given_up_for_the_next(monkeypatch):
    from mutualrl.weights import transport

    monkeypatch.setattr(transport, "JOIN_RETRY_S", 1.0)
    port = free_port()
    sender = hf_sender("127.0.0.1", port, timeout_s=60)
    ex = ExperienceExchange(InProcessBroker(), "mutualrl:hs")
    publisher = WeightsPublisher(POLICY, ex, sender)
    refused: list[int] = []
    engine = Engine(None)
    follower = _follower(ex, "collective", None, engine, on_refused=lambda v, e: refused.append(v))
    engine.receiver = follower.receiver = hf_receiver("127.0.0.1", port, timeout_s=60, newest=follower.newest_announced)
    stop = threading.Event()
    follower.follow(stop)
    try:
        _publish(ex, publisher, 1, _state(1))
        _wait(follower.caught_up)
        # the learner announces version 2 and dies before broadcasting it
        dead = pb.WeightsPublished(policy=POLICY, version=2, uri=f"collective://{POLICY}/2", step=2, checksum="",
                                   tensors=[pb.TensorSpec(name="w", dtype="float32", shape=[8, 4]),
                                            pb.TensorSpec(name="b", dtype="bfloat16", shape=[3])])
        ex.publish(dead, POLICY, 2)
        time.sleep(1.5)  # the follower waits in version 2's group
        assert engine.version == 1
        restarted = WeightsPublisher(POLICY, ex, sender)
        restarted.continue_after()
        assert _publish(ex, restarted, 2, _state(3)) == 3
        _wait(follower.caught_up)
    finally:
        stop.set()
    assert refused == [2] and engine.version == 3 and torch.equal(engine.state["w"], _state(3)["w"])


def test_a_version_superseded_before_it_was_loaded_keeps_the_rollout_side_waiting(tmp_path):
    """A rollout service restarted beside its learner (shm): the announced version's slot is gone
    by the time it reads it. It must not count as caught up on its starting weights — that sampled
    a whole step too stale to train (a kill-9 test's lost step) — but wait for the restarted
    learner's next version."""
    from mutualrl.weights.shm import ShmReceiver, ShmSender

    ex = ExperienceExchange(InProcessBroker(), "mutualrl:hs")
    engine = Engine(ShmReceiver())
    follower = _follower(ex, "shm", engine.receiver, engine)
    first = ShmSender(tmp_path / "w", POLICY, directory=tmp_path)
    _publish(ex, WeightsPublisher(POLICY, ex, first), 1, _state(1))
    first.close()  # the learner is killed and its slots reclaimed before the rollout side reads them
    follower.load_newest()
    follower.load_newest()  # tried once, not again and again
    assert engine.version == 0 and engine.loads == 0
    assert not follower.caught_up()  # so it samples nothing with its starting weights
    restarted = WeightsPublisher(POLICY, ex, ShmSender(tmp_path / "w", POLICY, directory=tmp_path))
    restarted.continue_after()
    assert _publish(ex, restarted, 1, _state(11)) == 2
    follower.load_newest()
    assert follower.caught_up() and engine.version == 2 and torch.equal(engine.state["w"], _state(11)["w"])


def test_an_engine_left_with_torn_weights_stops_the_follower_instead_of_serving_them(tmp_path):
    """WeightsTorn (a shared-memory copy the learner's slot never settled for): not a refusal to count and serve
    on, but the end of the follower, so the rollout service exits and restarts on whole weights."""
    from mutualrl.weights.shm import ShmSender
    from mutualrl.weights.transport import WeightsTorn

    ex = ExperienceExchange(InProcessBroker(), "mutualrl:torn")

    def torn(version, uri, checksum, manifest):
        raise WeightsTorn(f"{uri}: a mix of versions")

    follower = WeightsFollower(POLICY, ex, None, torn, lambda: 0)
    _publish(ex, WeightsPublisher(POLICY, ex, ShmSender(tmp_path / "w", POLICY, directory=tmp_path)), 1, _state(1))
    with pytest.raises(WeightsTorn):
        follower.load_newest()
    stop = threading.Event()
    follower.follow(stop).join(timeout=30)
    assert stop.is_set()  # the follower's thread ended and stopped the service
    with pytest.raises(RuntimeError, match="weights follower failed"):
        follower.caught_up()
