"""The rollout engine contract, run over every registered engine: hf on a real tiny model with a weight store,
and the vLLM and SGLang adapters against stand-in servers that answer their documented routes (neither engine
runs on a CPU). A new engine passes this suite (docs/architecture.md, "Where to add an engine").

What every engine must do (services/rollout/engine.py): build itself from a policy's engine config through the
registry, say its name and weights version, return ``n`` samples per prompt in prompt order with one behaviour
log-prob per token, stop when the caller cancels, and serve a new version only once it loaded."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, get_args

import pytest
import torch
from test_http_engines import Fake, _sglang_routes, _vllm_routes
from tiny_engine import tiny_engine

from mutualrl.config.engines import ENGINES, engine_facts
from mutualrl.config.schema import EngineConfig
from mutualrl.models.generation import GenerationCancelled
from mutualrl.services.rollout.engine import RolloutEngine, SamplingSpec
from mutualrl.services.rollout.factory import build_engine, probe_engine
from mutualrl.services.rollout.registry import ENGINE_CLASSES, engine_class
from mutualrl.weights import WeightStore


@dataclass
class Case:
    """One engine under test: the engine built through the registry, a new version's (uri, checksum), the
    prompts it can take, and what to release afterwards."""
    engine: RolloutEngine
    new_version: tuple[str, str | None]
    prompts: list[list[int]]
    close: Callable[[], None]


def _hf(tmp_path) -> Case:
    arts, store, _ = tiny_engine(tmp_path / "w", max_positions=64, seed=0, train_size=64, eval_size=8)
    engine = build_engine(EngineConfig(backend="hf"), arts.model, arts.tokenizer, store, "tiny")
    state = {k: v + 0.01 for k, v in arts.model.state_dict().items()}
    uri, checksum = store.put("tiny", 1, state, model_config=arts.model.config)
    prompt = arts.tokenizer("12+3=")["input_ids"]
    return Case(engine, (uri, checksum), [prompt, prompt[:3]], lambda: None)


def _server(kind: str, routes) -> Callable:
    def make(tmp_path) -> Case:
        from transformers import LlamaConfig

        fake = Fake(routes())
        tok = type("Tok", (), {"eos_token_id": 2, "pad_token_id": 0})()
        store = WeightStore(tmp_path / "w")
        engine = build_engine(EngineConfig(backend=kind, url=fake.url), None, tok, store, "M")
        cfg = LlamaConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=16)
        uri, checksum = store.put("M", 1, {"w": torch.ones(2, 2)}, model_config=cfg)
        return Case(engine, (uri, checksum), [[1, 2], [3]], fake.close)
    return make


CASES = {"hf": _hf, "vllm": _server("vllm", _vllm_routes), "sglang": _server("sglang", _sglang_routes)}


def test_the_registry_the_facts_and_the_config_name_the_same_engines():
    literal = set(get_args(EngineConfig.model_fields["backend"].annotation))
    assert set(ENGINE_CLASSES) == set(ENGINES) == literal == set(CASES)
    for name, cls in ENGINE_CLASSES.items():
        assert cls.facts is engine_facts(name) and engine_class(name) is cls
        assert (cls.facts.server is None) == cls.facts.in_process  # a server engine says how it is started
    with pytest.raises(ValueError, match="registered: hf, vllm, sglang"):
        engine_class("trt")
    with pytest.raises(ValueError, match="known: hf, vllm, sglang"):
        engine_facts("trt")


@pytest.fixture(params=sorted(CASES))
def case(request, tmp_path):
    c = CASES[request.param](tmp_path)
    yield c
    c.close()


def test_an_engine_is_built_through_the_registry_and_says_what_it_is(case):
    eng = case.engine
    assert type(eng) is engine_class(eng.facts.name)
    info = eng.info()
    assert info.engine == eng.facts.name and info.weights_version == 0
    assert eng.health() == "ok"


def test_an_engine_returns_n_samples_per_prompt_in_order_with_a_logprob_per_token(case):
    groups = case.engine.generate(case.prompts, SamplingSpec(n=2, max_new_tokens=4, temperature=1.0, seed=3))
    assert len(groups) == len(case.prompts)
    for group in groups:
        assert len(group) == 2
        for s in group:
            assert 1 <= len(s.token_ids) <= 4 and len(s.logprobs) == len(s.token_ids)
            assert all(lp <= 0.0 for lp in s.logprobs)
            assert s.finish_reason in ("stop", "length")


def test_an_engine_stops_when_its_caller_cancels(case):
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(GenerationCancelled):
        case.engine.generate(case.prompts, SamplingSpec(n=1, max_new_tokens=4), cancel=cancel)


def test_an_engine_serves_a_new_version_once_loaded(case):
    uri, checksum = case.new_version
    case.engine.update_weights(1, uri, checksum)
    assert case.engine.info().weights_version == 1
    groups = case.engine.generate(case.prompts[:1], SamplingSpec(n=1, max_new_tokens=3, seed=1))
    assert len(groups) == 1 and len(groups[0]) == 1


def test_probing_a_config_reaches_the_server_or_needs_nothing(case):
    eng = case.engine
    if eng.facts.in_process:
        assert probe_engine(EngineConfig(backend=eng.facts.name)) == {"engine": eng.facts.name}
    else:
        got = probe_engine(EngineConfig(backend=eng.facts.name, url=eng.base))
        assert got["engine"] == eng.facts.name and got["version"] not in (None, "?")
