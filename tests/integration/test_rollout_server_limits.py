"""The rollout gRPC server under hostile or careless clients, over a real socket: a request past
the model's context is INVALID_ARGUMENT naming the limit, a client that gives up stops its
generation (the next request is not kept waiting), and UpdateWeights only takes the version the
policy's learner announced on SEE."""

from __future__ import annotations

import time

import grpc
import pytest

from mutualrl.models import load_policy
from mutualrl.models.families import ModelShape
from mutualrl.services.rollout import HFEngine
from mutualrl.services.rollout.server import RolloutServicer, serve
from mutualrl.v1 import rollout_service_pb2 as rpb
from mutualrl.v1 import rollout_service_pb2_grpc as rgrpc
from mutualrl.weights import WeightStore

SHAPE = ModelShape(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_positions=4096)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from mutualrl.tasks import build_task

    task = build_task("arithmetic", seed=0, min_digits=1, max_digits=2, train_size=200, eval_size=8)
    arts = load_policy(family="llama", shape=SHAPE, tokenizer_kind="char", corpus=task.corpus, corpus_fingerprint=task.fingerprint(), seed=3)
    store = WeightStore(tmp_path_factory.mktemp("weights"))
    engine = HFEngine(arts.model, eos_id=arts.tokenizer.eos_token_id, pad_id=arts.tokenizer.pad_token_id, store=store)
    announced: dict = {"v": None}
    servicer = RolloutServicer("a", engine, arts.tokenizer, arts.fingerprint, max_context=4096, announced=lambda: announced["v"])
    server, port = serve(servicer)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield {"stub": rgrpc.RolloutServiceStub(channel), "arts": arts, "store": store, "announced": announced, "servicer": servicer}
    channel.close()
    server.stop(grace=None)


def _req(n=1, max_new_tokens=4, prompts=1):
    return rpb.GenerateRequest(prompts=[rpb.Prompt(prompt_id=f"p{i}", text="Q: 1+2=") for i in range(prompts)],
                               sampling=rpb.SamplingParams(n=n, max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, seed=1))


def test_a_request_past_the_context_names_the_limit(stack):
    with pytest.raises(grpc.RpcError) as e:
        stack["stub"].Generate(_req(max_new_tokens=4095), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "context of 4096 tokens" in e.value.details()
    assert len(stack["stub"].Generate(_req(), timeout=30).groups) == 1


def test_a_client_that_gives_up_stops_its_generation(stack):
    stub = stack["stub"]
    with pytest.raises(grpc.RpcError) as e:  # ~4,000 tokens for 64 sequences: far longer than the deadline
        stub.Generate(_req(n=64, max_new_tokens=4000), timeout=0.5)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    t = time.monotonic()
    stub.Generate(_req(), timeout=30)
    assert time.monotonic() - t < 5.0  # the abandoned generation released the model
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        text = stack["servicer"].registry.get_sample_value("mutualrl_rollout_requests_total", {"policy": "a", "method": "Generate", "code": "CANCELLED"})
        if text:
            break
        time.sleep(0.1)
    assert text == 1.0


def test_update_weights_takes_only_the_announced_version(stack):
    stub, store, arts, announced = stack["stub"], stack["store"], stack["arts"], stack["announced"]
    uri, checksum = store.put("a", 1, {k: v + 0.0 for k, v in arts.model.state_dict().items()})
    with pytest.raises(grpc.RpcError) as e:  # nothing announced yet
        stub.UpdateWeights(rpb.UpdateWeightsRequest(version=1, uri=uri, checksum=checksum), timeout=30)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "not announced" in e.value.details()
    announced["v"] = (1, checksum)
    with pytest.raises(grpc.RpcError) as e:  # a huge version would freeze the server on it forever
        stub.UpdateWeights(rpb.UpdateWeightsRequest(version=10 ** 12, uri=uri, checksum=checksum), timeout=30)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as e:
        stub.UpdateWeights(rpb.UpdateWeightsRequest(version=1, uri=uri, checksum="f" * 64), timeout=30)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "checksum" in e.value.details()
    assert stub.UpdateWeights(rpb.UpdateWeightsRequest(version=1, uri=uri, checksum=checksum), timeout=60).version == 1
