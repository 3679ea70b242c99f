"""The rollout server over a real gRPC socket on loopback: generation with log-probs, version
gating, weight updates from a weight-store directory, malformed requests answered with
INVALID_ARGUMENT while the server keeps serving, and /metrics + /healthz over HTTP."""

import json
import urllib.request

import grpc
import pytest
import torch
from tiny_engine import tiny_engine  # beside this file

from mutualrl.runtime.http_endpoints import OpsServer
from mutualrl.services.rollout.server import RolloutServicer, serve
from mutualrl.v1 import rollout_service_pb2 as rpb
from mutualrl.v1 import rollout_service_pb2_grpc as rgrpc


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    arts, store, engine = tiny_engine(tmp_path_factory.mktemp("weights"), max_positions=64, seed=1,
                                      train_size=500, eval_size=16)
    servicer = RolloutServicer("a", engine, arts.tokenizer, arts.fingerprint)
    server, port = serve(servicer)
    ops = OpsServer(servicer.registry, servicer.health_dict).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield {"stub": rgrpc.RolloutServiceStub(channel), "arts": arts, "store": store, "ops": ops, "engine": engine}
    channel.close()
    server.stop(grace=None)
    ops.stop()


def _req(**kw):
    sampling = kw.pop("sampling", rpb.SamplingParams(n=3, max_new_tokens=4, temperature=1.0, top_p=1.0, seed=7))
    prompts = kw.pop("prompts", [rpb.Prompt(prompt_id="p0", text="Q: "
                                            "1+2="), rpb.Prompt(prompt_id="p1", text="Q: 3+4=")])
    return rpb.GenerateRequest(prompts=prompts, sampling=sampling, **kw)


def test_generate_groups_with_logprobs_and_seeded_reproducibility(stack):
    stub = stack["stub"]
    resp = stub.Generate(_req(), timeout=60)
    assert [g.prompt_id for g in resp.groups] == ["p0", "p1"] and resp.weights_version == 0
    for g in resp.groups:
        assert len(g.completions) == 3 and g.prompt_token_ids
        for c in g.completions:
            assert 1 <= len(c.token_ids) <= 4 and len(c.logprobs) == len(c.token_ids)
            assert all(lp <= 0 for lp in c.logprobs) and c.finish_reason in ("stop", "length")
    again = stub.Generate(_req(), timeout=60)
    def ids(r):
        return [list(c.token_ids) for g in r.groups for c in g.completions]

    assert ids(again) == ids(resp)


@pytest.mark.parametrize(
    "kw,needle",
    [
        ({"prompts": []}, "prompts is empty"),
        ({"sampling": rpb.SamplingParams(n=0, max_new_tokens=4, top_p=1.0)}, "sampling.n"),
        ({"sampling": rpb.SamplingParams(n=1, max_new_tokens=0, top_p=1.0)}, "max_new_tokens"),
        ({"sampling": rpb.SamplingParams(n=1, max_new_tokens=4, top_p=0.0)}, "top_p"),
        ({"sampling": rpb.SamplingParams(n=1, max_new_tokens=4, top_p=1.0, temperature=float("nan"))}, "temperature"),
        ({"prompts": [rpb.Prompt(prompt_id="x", token_ids=[1, 99999])]}, "outside the vocabulary"),
        ({"prompts": [rpb.Prompt(prompt_id="x")]}, "neither text nor token_ids"),
    ],
)
def test_malformed_requests_get_invalid_argument_and_the_server_keeps_serving(stack, kw, needle):
    stub = stack["stub"]
    req = _req(**kw) if "sampling" in kw or "prompts" in kw else _req()
    if kw == {"prompts": []}:
        req = rpb.GenerateRequest(sampling=rpb.SamplingParams(n=1, max_new_tokens=4, top_p=1.0))
    with pytest.raises(grpc.RpcError) as e:
        stub.Generate(req, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and needle in e.value.details()
    assert stub.Health(rpb.HealthRequest(), timeout=10).status == "ok"
    assert len(stub.Generate(_req(), timeout=60).groups) == 2


def test_version_gate_and_weight_updates(stack):
    stub, store, arts = stack["stub"], stack["store"], stack["arts"]
    with pytest.raises(grpc.RpcError) as e:
        stub.Generate(_req(min_weights_version=1), timeout=30)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    state = {k: v + 0.01 for k, v in arts.model.state_dict().items()}
    uri, checksum = store.put("a", 1, state)
    with pytest.raises(grpc.RpcError) as e:
        stub.UpdateWeights(rpb.UpdateWeightsRequest(version=1, uri=uri, checksum="0" * 64), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "checksum" in e.value.details()
    assert stub.UpdateWeights(rpb.UpdateWeightsRequest(version=1, uri=uri, checksum=checksum), timeout=60).version == 1
    assert stub.Health(rpb.HealthRequest(), timeout=10).weights_version == 1
    loaded = stack["engine"].model.state_dict()
    assert all(torch.equal(loaded[k], state[k]) for k in loaded if k in state)
    assert stub.Generate(_req(min_weights_version=1), timeout=60).weights_version == 1
    with pytest.raises(grpc.RpcError) as e:
        stub.UpdateWeights(rpb.UpdateWeightsRequest(version=1, uri=uri), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not newer" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.UpdateWeights(rpb.UpdateWeightsRequest(version=5, uri=str(store.root / "a" / "v5")), timeout=30)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_metrics_and_healthz_over_http(stack):
    stack["stub"].Generate(_req(), timeout=60)
    port = stack["ops"].port
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'mutualrl_rollout_requests_total{code="OK",method="Generate",policy="a"}' in text
    assert "mutualrl_rollout_completions_total" in text and "mutualrl_weights_version" in text
    health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10).read())
    assert health["status"] == "ok" and health["role"] == "rollout"
