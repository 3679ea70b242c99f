"""Weights versions sent as deltas (libs/weights/src/mutualrl/weights/deltas.py, docs/algorithms.md §7.3).

The codec round-trips bit for bit (properties over random tensors and change masks); over 20 AdamW steps of a
real (tiny) transformers model, a bf16 engine fed deltas through the handshake serves weights bitwise equal to
one fed every version whole — through the filesystem store and through shared-memory slots — with a version
whose delta is too large sent whole, and a restarted rollout side (no base) asking again and getting the weights
whole; `weights.deltas` is decided as documented and refused where it cannot apply."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mutualrl.config import ExperimentConfig
from mutualrl.models import build_model
from mutualrl.models.families import ModelShape
from mutualrl.models.precision import resolve_precision
from mutualrl.see import ExperienceExchange, InProcessBroker
from mutualrl.services.learner.setup import delta_dtype
from mutualrl.services.rollout import HFEngine
from mutualrl.v1 import experience_pb2 as pb
from mutualrl.weights import WeightStore
from mutualrl.weights.deltas import BASE_KEY, DeltaReceiver, DeltaSender, apply_delta, bits, encode_delta
from mutualrl.weights.handshake import AWAITING_WEIGHTS, WeightsFollower, WeightsPublisher
from mutualrl.weights.shm import ShmReceiver, ShmSender

POLICY = "p"


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), seed=st.integers(0, 2**16), share=st.floats(0.0, 1.0),
       dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
def test_a_delta_rebuilds_the_new_tensor_bit_for_bit(n, seed, share, dtype):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, generator=g).to(dtype)
    new = base.clone()
    changed = torch.rand(n, generator=g) < share
    new[changed] = torch.randn(int(changed.sum()), generator=g).to(dtype)
    blob = encode_delta(new.reshape(1, n), base.reshape(1, n))
    if not torch.equal(bits(new), bits(base)):
        rebuilt = base.clone()
        apply_delta(rebuilt, blob)
        assert torch.equal(bits(rebuilt), bits(new))
    else:
        assert blob is None  # nothing changed: nothing sent


def test_signed_zeros_and_nans_count_as_their_bits():
    base = torch.tensor([0.0, float("nan"), 1.0], dtype=torch.bfloat16)
    new = torch.tensor([-0.0, float("nan"), 1.0], dtype=torch.bfloat16)
    rebuilt = base.clone()
    apply_delta(rebuilt, encode_delta(new, base))
    assert torch.equal(bits(rebuilt), bits(new))


def test_a_corrupt_or_mismatched_delta_is_one_clear_error():
    base = torch.zeros(8, dtype=torch.bfloat16)
    blob = encode_delta(torch.ones(8, dtype=torch.bfloat16), base)
    with pytest.raises(ValueError, match="position 7 of a tensor of 4"):
        apply_delta(torch.zeros(4, dtype=torch.bfloat16), blob)
    with pytest.raises(ValueError, match="same shape and dtype"):
        encode_delta(torch.ones(8), base)
    import zlib

    cut = torch.frombuffer(bytearray(zlib.compress(zlib.decompress(blob.numpy().tobytes())[:-3])), dtype=torch.uint8)
    with pytest.raises(ValueError, match="cut or corrupt"):
        apply_delta(base.clone(), cut)


def _model(tok):
    ids = {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    return build_model("llama", len(tok), ModelShape(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                                                     max_positions=64), ids, seed=0)


def _engine(model, tok, receiver, precision) -> HFEngine:
    return HFEngine(copy.deepcopy(model), eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, store=receiver,
                    precision=precision)


def _follower(ex, receiver, engine) -> WeightsFollower:
    if isinstance(receiver, DeltaReceiver):
        receiver.attach(engine.model.state_dict, lambda: engine.info().weights_version)
    return WeightsFollower(POLICY, ex, receiver, engine.update_weights, lambda: engine.info().weights_version)


def _same(a: HFEngine, b: HFEngine) -> bool:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(bits(sa[k]), bits(sb[k])) for k in sa)


@pytest.fixture(params=["filesystem", "shm"])
def transports(request, tmp_path):
    """(sender, receiver factory) of the transport deltas travel through."""
    if request.param == "filesystem":
        store = WeightStore(tmp_path / "weights")
        return store, lambda: WeightStore(tmp_path / "weights")
    return ShmSender(tmp_path / "weights", POLICY, directory=tmp_path / "shm"), ShmReceiver


def test_twenty_steps_of_deltas_serve_the_same_bits_as_whole_versions(tokenizers, transports):
    tok = tokenizers["char"]
    bf16 = resolve_precision("bf16-mixed", pretrained=True, device="cpu")
    sender, receiver_for = transports
    learner = _model(tok)  # fp32 masters, as bf16-mixed keeps them
    opt = torch.optim.AdamW(learner.parameters(), lr=1e-5)
    ex_delta, ex_whole = (ExperienceExchange(InProcessBroker(), f"mutualrl:{n}") for n in ("delta", "whole"))
    deltas = DeltaSender(sender, torch.bfloat16, max_share=0.5)
    pub_delta = WeightsPublisher(POLICY, ex_delta, deltas)
    pub_whole = WeightsPublisher(POLICY, ex_whole, WeightStore())  # the reference: every version whole, fp32
    engine = _engine(learner, tok, DeltaReceiver(receiver_for()), bf16)
    reference = _engine(learner, tok, pub_whole.sender, bf16)
    follower = _follower(ex_delta, engine.store, engine)
    ref_follower = _follower(ex_whole, reference.store, reference)
    g = torch.Generator().manual_seed(0)
    kinds = []
    for step in range(1, 21):
        if step == 8:  # a large step: most bf16 values change, and the delta would not pay
            for q in opt.param_groups:
                q["lr"] = 1e-1
        elif step == 9:
            for q in opt.param_groups:
                q["lr"] = 1e-5
        for q in learner.parameters():
            q.grad = torch.randn(q.shape, generator=g)
        opt.step()
        if step == 13:  # the rollout side restarts: its engine serves the starting weights, no base for a delta
            engine = _engine(_model(tok), tok, DeltaReceiver(receiver_for()), bf16)
            follower = _follower(ex_delta, engine.store, engine)
        pub_delta.publish(step, learner.state_dict())
        kinds.append(deltas.last_kind)
        pub_whole.publish(step, learner.state_dict())
        ref_follower.load_newest()
        follower.load_newest()
        if step == 13:
            assert engine.info().weights_version == 0 and not follower.caught_up()  # it asked, and samples nothing
            hb = ex_delta.last("heartbeat", f"{POLICY}.rollout")
            assert hb.payload.status == AWAITING_WEIGHTS and pub_delta.asked_again()
            pub_delta.send_whole_next()  # the learner answers: the same weights again, whole
            pub_delta.publish(step, learner.state_dict())
            kinds.append("answer:" + deltas.last_kind)
            follower.load_newest()
        assert follower.caught_up() and _same(engine, reference), step
    # whole: the first version, the large step's, and the answer to the restarted side; every other a delta
    assert kinds == ["full", *["delta"] * 6, "full", *["delta"] * 5, "answer:full", *["delta"] * 7], kinds
    assert deltas.last_bytes < 0.5 * reference.model.num_parameters() * 2


def test_a_delta_against_a_version_the_engine_does_not_serve_is_refused_and_asked_for_whole(tokenizers, tmp_path):
    tok = tokenizers["char"]
    bf16 = resolve_precision("bf16-mixed", pretrained=True, device="cpu")
    model = _model(tok)
    ex = ExperienceExchange(InProcessBroker(), "mutualrl:skip")
    deltas = DeltaSender(WeightStore(tmp_path / "w"), torch.bfloat16)
    pub = WeightsPublisher(POLICY, ex, deltas)
    engine = _engine(model, tok, DeltaReceiver(WeightStore(tmp_path / "w")), bf16)
    follower = _follower(ex, engine.store, engine)
    ex.publish(pb.Heartbeat(role="rollout", step=1, version=0, status="ok"), f"{POLICY}.rollout")
    for step in (1, 2, 3):  # the follower reads only the newest: version 3 is a delta against 2, never loaded
        with torch.no_grad():
            for q in model.parameters():
                q.view(-1)[:3] += 1.0  # a few values change
        pub.publish(step, model.state_dict())
    assert deltas.last_kind == "delta"
    follower.load_newest()
    assert engine.info().weights_version == 0 and not follower.caught_up() and pub.asked_again()
    pub.send_whole_next()
    pub.publish(3, model.state_dict())
    follower.load_newest()
    assert follower.caught_up() and engine.info().weights_version == 4
    assert BASE_KEY not in WeightStore(tmp_path / "w").get(str(tmp_path / "w" / POLICY / "v4"))


def test_deltas_are_on_where_they_pay_and_refused_where_they_cannot_apply():
    pol = {"name": "a", "model": {"family": "llama"}, "tokenizer": {"kind": "char"}}
    base = {"name": "t", "policies": [pol]}
    bf16 = resolve_precision("bf16-mixed", pretrained=True, device="cpu")
    fp32 = resolve_precision("float32", pretrained=True, device="cpu")
    auto = ExperimentConfig.model_validate(base)
    assert delta_dtype(auto, "hf", bf16) == torch.bfloat16
    assert delta_dtype(auto, "hf", fp32) is None  # most fp32 values change every step
    assert delta_dtype(auto, "vllm", bf16) is None  # a server reloads whole checkpoints
    on = ExperimentConfig.model_validate({**base, "weights": {"deltas": "on"}})
    assert delta_dtype(on, "hf", fp32) == torch.float32
    off = ExperimentConfig.model_validate({**base, "weights": {"deltas": "off"}})
    assert delta_dtype(off, "hf", bf16) is None
    with pytest.raises(ValueError, match="not collective"):
        ExperimentConfig.model_validate({**base, "weights": {"deltas": "on", "transport": "collective"}})
    with pytest.raises(ValueError, match="no policy has an hf engine"):
        ExperimentConfig.model_validate({**base, "weights": {"deltas": "on"}, "policies": [
            {**pol, "engine": {"backend": "vllm", "url": "http://h:8000"}}]})
