"""The `shared` weight transport of `mutualrl run`: the engine samples the learner's own module, versions are
announced and followed as before, nothing is copied; an engine with a copy of its own refuses a shared version,
and a sharing engine refuses one it would have to load."""

import pytest

from mutualrl.models import build_model
from mutualrl.models.families import ModelShape
from mutualrl.see import ExperienceExchange, InProcessBroker
from mutualrl.services.rollout import HFEngine, SamplingSpec
from mutualrl.weights import WeightStore
from mutualrl.weights.handshake import WeightsFollower, WeightsPublisher
from mutualrl.weights.shared import SharedModelSender, shared_uri


def _model(tok):
    ids = {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    return build_model("llama", len(tok), ModelShape(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                                                     max_positions=64), ids, seed=0)


def test_a_sharing_engine_serves_each_announced_version_from_the_learners_module(tokenizers):
    tok = tokenizers["char"]
    model = _model(tok)
    ex = ExperienceExchange(InProcessBroker(), "mutualrl:shared")
    sender = SharedModelSender()
    engine = HFEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, store=sender, share=True)
    assert engine.model is model  # no copy
    publisher = WeightsPublisher("a", ex, sender, model_config=model.config)
    follower = WeightsFollower("a", ex, sender, engine.update_weights, lambda: engine.info().weights_version)
    before = engine.generate([tok("1+2=")["input_ids"]], SamplingSpec(n=2, max_new_tokens=3, seed=0))
    for p in model.parameters():  # the learner's update: the engine sees it with no load
        p.data.add_(0.5)
    assert publisher.publish(1, model.state_dict()) == 1
    follower.load_newest()
    assert engine.info().weights_version == 1
    after = engine.generate([tok("1+2=")["input_ids"]], SamplingSpec(n=2, max_new_tokens=3, seed=0))
    assert [s.logprobs for s in after[0]] != [s.logprobs for s in before[0]]
    with pytest.raises(ValueError, match="not newer"):
        engine.update_weights(1, shared_uri("a", 1))
    with pytest.raises(ValueError, match="shares the learner's module"):
        engine.update_weights(2, "inproc://a/2")


def test_an_engine_with_its_own_copy_refuses_a_shared_version(tokenizers):
    tok = tokenizers["char"]
    engine = HFEngine(_model(tok), eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, store=WeightStore())
    with pytest.raises(ValueError, match="does not share the learner's module"):
        engine.update_weights(1, shared_uri("a", 1))
    with pytest.raises(ValueError, match="served from the learner's own module"):
        SharedModelSender().get(shared_uri("a", 1))
