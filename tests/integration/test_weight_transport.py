"""The weight-transport contract, run against every transport: ``filesystem`` (WeightStore, a
directory of safetensors checkpoints), ``collective`` (broadcast over a real gloo process
group on loopback — the NCCL protocol's CPU twin) and ``shm`` (double-buffered slots in shared
memory, here under a temporary directory) — exact round trips of every dtype, versions
that only move forward, checksums that catch a wrong announcement, and an HF engine that
serves exactly the learner's weights after an update."""

from __future__ import annotations

import threading

import pytest
import torch

from mutualrl.models import load_policy
from mutualrl.models.families import ModelShape
from mutualrl.see.server import free_port
from mutualrl.services.rollout import HFEngine, SamplingSpec
from mutualrl.weights import TensorManifest, WeightStore, hf_receiver, hf_sender
from mutualrl.weights import store as store_module
from mutualrl.weights.shm import ShmReceiver, ShmSender

KINDS = ["filesystem", "collective", "shm"]


def _collective_pair():
    """The learner's (rank 0) and the engine's (rank 1) ends of a real gloo weight group on loopback."""
    port = free_port()
    return hf_sender("127.0.0.1", port, timeout_s=60), hf_receiver("127.0.0.1", port, timeout_s=60)


@pytest.fixture
def pair(request, tmp_path):
    """(kind, sender, receiver): the learner's end and the engine's end of one transport."""
    if request.param == "filesystem":
        s = WeightStore(tmp_path / "weights")
        return request.param, s, s
    if request.param == "shm":
        return request.param, ShmSender(tmp_path / "weights", "p", directory=tmp_path / "shm"), ShmReceiver()
    return (request.param, *_collective_pair())


def transfer(kind, sender, policy, version, state, receive):
    """``publish`` on the learner's side; ``receive(uri, checksum, manifest)`` starts on the
    engine's side when the version is announced, as a rollout service's follower does (for a
    collective version, while the learner broadcasts)."""
    out: dict = {}

    def on_announce(uri: str, checksum: str, manifest: TensorManifest | None) -> None:
        def take():
            try:
                out["got"] = receive(uri, checksum, manifest)
            except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
                out["error"] = e
        out["thread"] = threading.Thread(target=take)
        out["thread"].start()

    uri, checksum = sender.publish(policy, version, state, on_announce)
    out["thread"].join(timeout=60)
    if "error" in out:
        raise out["error"]
    return uri, checksum, out["got"]


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(16, 8, generator=g), "b16": torch.randn(4, 4, generator=g).to(torch.bfloat16),
            "h16": torch.randn(3, generator=g).half(), "steps": torch.tensor([seed], dtype=torch.int64),
            "flag": torch.tensor([True])}


@pytest.mark.parametrize("pair", KINDS, indirect=True)
def test_versions_round_trip_exactly(pair):
    kind, sender, receiver = pair
    for version in (1, 2):
        state = _state(version)
        uri, checksum, got = transfer(kind, sender, "p", version, state, receiver.get)
        assert set(got) == set(state)
        assert len(checksum) == 64 if kind != "shm" else checksum == f"shm:{version}:768"  # 64-byte aligned tensors
        for k, v in state.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
        if kind == "filesystem":  # a file stays readable after the first read
            assert torch.equal(receiver.get(uri, checksum)["w"], state["w"])


@pytest.mark.parametrize("pair", KINDS, indirect=True)
def test_a_wrong_announced_checksum_is_refused(pair):
    kind, sender, receiver = pair
    with pytest.raises(ValueError, match="checksum"):
        transfer(kind, sender, "p", 1, _state(1), lambda u, c, m: receiver.get(u, "0" * 64, m))


def test_a_collective_version_must_move_forward():
    sender, receiver = _collective_pair()
    transfer("collective", sender, "p", 2, _state(2), receiver.get)
    with pytest.raises(ValueError, match="not newer"):  # every tensor was still taken: the learner returned
        transfer("collective", sender, "p", 1, _state(1), receiver.get)
    with pytest.raises(ValueError, match="manifest"):
        receiver.get("collective://p/3", None, None)


def test_a_collective_group_is_met_again_after_either_end_restarts():
    """A fresh group per version on the learner's store: a new receiver (a restarted rollout
    service) meets the learner at the next version, and a new learner is met at its first version
    (`up`'s restart of a learner process on the same port: tests/e2e/test_up_collective.py)."""
    port = free_port()
    sender = hf_sender("127.0.0.1", port, timeout_s=60)
    transfer("collective", sender, "p", 1, _state(1), hf_receiver("127.0.0.1", port, timeout_s=60).get)
    uri, _, got = transfer("collective", sender, "p", 2, _state(2), hf_receiver("127.0.0.1", port, timeout_s=60).get)
    assert torch.equal(got["w"], _state(2)["w"])
    receiver = hf_receiver("127.0.0.1", port, timeout_s=60)
    transfer("collective", sender, "p", 3, _state(3), receiver.get)
    port2 = free_port()
    receiver2 = hf_receiver("127.0.0.1", port2, timeout_s=60)
    _, _, got = transfer("collective", hf_sender("127.0.0.1", port2, timeout_s=60), "p", 4, _state(4), receiver2.get)
    assert torch.equal(got["b16"], _state(4)["b16"])


def test_the_manifest_travels_in_the_announcement():
    from mutualrl.v1 import experience_pb2 as pb

    m = TensorManifest.of(_state(1))
    wire = pb.WeightsPublished(tensors=m.to_proto()).SerializeToString()
    assert TensorManifest.from_proto(pb.WeightsPublished.FromString(wire).tensors) == m
    assert TensorManifest.from_proto([]) is None
    assert m.byte_count() == sum(t.numel() * t.element_size() for t in _state(1).values())
    with pytest.raises(ValueError, match="unsupported dtypes"):
        TensorManifest(("a",), ("complex64",), ((1,),))


def test_the_filesystem_checks_a_version_once_not_on_every_read(tmp_path, monkeypatch):
    s = WeightStore(tmp_path)
    uri, checksum = s.put("p", 1, _state(1))
    calls = []
    real = store_module.tensor_checksum
    monkeypatch.setattr(store_module, "tensor_checksum", lambda st: calls.append(1) or real(st))
    for _ in range(3):
        s.get(uri, checksum)
    assert len(calls) == 1
    s.put("p", 2, _state(2))
    s.acknowledge("p", 3)  # keep 2: v1 goes
    with pytest.raises(FileNotFoundError):
        s.get(uri, checksum)


@pytest.mark.parametrize("pair", KINDS, indirect=True)
def test_an_hf_engine_serves_exactly_the_learners_weights(pair, arithmetic_task):
    kind, sender, receiver = pair
    shape = ModelShape(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_positions=64)

    def policy(seed):
        return load_policy(family="llama", shape=shape, tokenizer_kind="char", corpus=arithmetic_task.corpus,
                           corpus_fingerprint=arithmetic_task.fingerprint(), seed=seed)

    learner, served = policy(1), policy(2)
    tok = served.tokenizer
    engine = HFEngine(served.model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, store=receiver)
    reference = HFEngine(learner.model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, store=WeightStore())
    prompts = [tok.encode(p.prompt) for p in arithmetic_task.train[:4]]
    greedy = SamplingSpec(n=1, max_new_tokens=5, temperature=0.0)
    transfer(kind, sender, "p", 1, learner.model.state_dict(), lambda u, c, m: engine.update_weights(1, u, c, m))
    assert engine.info().weights_version == 1
    after = {k: v for k, v in engine.model.state_dict().items()}
    for k, v in learner.model.state_dict().items():
        assert torch.equal(after[k], v), k
    assert [[s.token_ids for s in g] for g in engine.generate(prompts,
        greedy)] == [[s.token_ids for s in g] for g in reference.generate(prompts, greedy)]


def test_a_version_whose_learner_died_before_sending_is_given_up_once_superseded(monkeypatch):
    """A receiver waiting in version 3's group, whose learner died, gives it up as soon as version 4
    is announced (the restarted learner waits in version 4's group), instead of waiting it out."""
    from mutualrl.weights import transport

    monkeypatch.setattr(transport, "JOIN_RETRY_S", 1.0)
    port = free_port()
    sender = hf_sender("127.0.0.1", port, timeout_s=60)
    receiver = hf_receiver("127.0.0.1", port, timeout_s=60, newest=lambda: 4)
    transfer("collective", sender, "p", 1, _state(1), receiver.get)  # the store is up (the learner's first version)
    manifest = TensorManifest.of(_state(3))
    with pytest.raises(ValueError, match="superseded"):
        receiver.get("collective://p/3", None, manifest)
    _, _, got = transfer("collective", sender, "p", 4, _state(4), receiver.get)
    assert torch.equal(got["w"], _state(4)["w"])
