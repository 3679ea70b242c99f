"""The rollout gRPC server under hostile or careless clients, over a real socket: a request past
the model's context is INVALID_ARGUMENT naming the limit, a client that gives up stops its
generation (the next request is not kept waiting), and UpdateWeights only takes the version the
policy's learner announced on SEE."""

from __future__ import annotations

import time

import grpc
import pytest
from tiny_engine import tiny_engine  # beside this file

from mutualrl.services.rollout import HFEngine
from mutualrl.services.rollout.server import RolloutServicer, serve, update_weights_token
from mutualrl.v1 import rollout_service_pb2 as rpb
from mutualrl.v1 import rollout_service_pb2_grpc as rgrpc


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    arts, store, engine = tiny_engine(tmp_path_factory.mktemp("weights"), max_positions=4096, seed=3,
                                      train_size=200, eval_size=8)
    announced: dict = {"v": None}
    servicer = RolloutServicer("a", engine, arts.tokenizer, arts.fingerprint, max_context=4096,
                               announced=lambda: announced["v"],
                               update_token=update_weights_token(b"run-key", "a"))
    server, port = serve(servicer)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield {"stub": rgrpc.RolloutServiceStub(channel), "arts": arts, "store": store, "announced": announced,
           "servicer": servicer}
    channel.close()
    server.stop(grace=None)


def _req(n=1, max_new_tokens=4, prompts=1):
    return rpb.GenerateRequest(prompts=[rpb.Prompt(prompt_id=f"p{i}", text="Q: 1+2=") for i in range(prompts)],
                               sampling=rpb.SamplingParams(n=n, max_new_tokens=max_new_tokens, temperature=1.0,
                                                           top_p=1.0, seed=1))


def test_a_request_past_the_context_names_the_limit(stack):
    with pytest.raises(grpc.RpcError) as e:
        stack["stub"].Generate(_req(max_new_tokens=4095), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "context of 4096 tokens" in e.value.details()
    assert len(stack["stub"].Generate(_req(), timeout=30).groups) == 1


def test_a_client_that_gives_up_stops_its_generation(stack):
    # an engine whose model never ends a completion (no token is its EOS): 64 x 4,000 tokens,
    # far longer than the client's deadline
    arts = stack["arts"]
    engine = HFEngine(arts.model, eos_id=-1, pad_id=arts.tokenizer.pad_token_id, store=stack["store"])
    servicer = RolloutServicer("a", engine, arts.tokenizer, arts.fingerprint, max_context=4096)
    server, port = serve(servicer)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = rgrpc.RolloutServiceStub(ch)
            with pytest.raises(grpc.RpcError) as e:
                stub.Generate(_req(n=64, max_new_tokens=4000), timeout=0.5)
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            t = time.monotonic()
            stub.Generate(_req(max_new_tokens=4), timeout=30)
            assert time.monotonic() - t < 5.0  # the abandoned generation released the model
        value = None
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not value:
            value = servicer.registry.get_sample_value("mutualrl_rollout_requests_total",
                                                       {"policy": "a", "method": "Generate", "code": "CANCELLED"})
            time.sleep(0.1)
        assert value == 1.0
    finally:
        server.stop(grace=None)


AUTH = (("authorization", "Bearer " + update_weights_token(b"run-key", "a")),)


def test_update_weights_needs_the_runs_token(stack):
    stub, store, arts = stack["stub"], stack["store"], stack["arts"]
    uri, checksum = store.put("a", 1, {k: v + 0.0 for k, v in arts.model.state_dict().items()})
    for metadata in ((), (("authorization", "Bearer " + update_weights_token(b"another-key", "a")),)):
        with pytest.raises(grpc.RpcError) as e:
            stub.UpdateWeights(rpb.UpdateWeightsRequest(version=1, uri=uri, checksum=checksum), timeout=30,
                               metadata=metadata)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_update_weights_takes_only_the_announced_version(stack):
    stub, store, arts, announced = stack["stub"], stack["store"], stack["arts"], stack["announced"]
    uri, checksum = store.put("a", 1, {k: v + 0.0 for k, v in arts.model.state_dict().items()})
    with pytest.raises(grpc.RpcError) as e:  # nothing announced yet
        stub.UpdateWeights(rpb.UpdateWeightsRequest(version=1, uri=uri, checksum=checksum), timeout=30, metadata=AUTH)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "not announced" in e.value.details()
    announced["v"] = (1, checksum)
    with pytest.raises(grpc.RpcError) as e:  # a huge version would freeze the server on it forever
        stub.UpdateWeights(rpb.UpdateWeightsRequest(version=10 ** 12, uri=uri, checksum=checksum), timeout=30,
                           metadata=AUTH)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as e:
        stub.UpdateWeights(rpb.UpdateWeightsRequest(version=1, uri=uri, checksum="f" * 64), timeout=30, metadata=AUTH)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "checksum" in e.value.details()
    assert stub.UpdateWeights(rpb.UpdateWeightsRequest(version=1, uri=uri, checksum=checksum), timeout=60,
                              metadata=AUTH).version == 1


def test_the_grpc_port_speaks_tls_when_a_certificate_is_configured(stack, tmp_path):
    """A self-signed certificate (openssl): a TLS client that trusts it is served; a plaintext
    client is not."""
    import shutil
    import subprocess

    openssl = shutil.which("openssl")
    assert openssl, "openssl is needed to make the test certificate"
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"], check=True,
                   capture_output=True)
    server, port = serve(stack["servicer"], tls=(cert.read_bytes(), key.read_bytes()))
    try:
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(f"localhost:{port}", creds) as ch:
            assert rgrpc.RolloutServiceStub(ch).Health(rpb.HealthRequest(), timeout=10).status == "ok"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            with pytest.raises(grpc.RpcError):
                rgrpc.RolloutServiceStub(ch).Health(rpb.HealthRequest(), timeout=3)
    finally:
        server.stop(grace=None)
