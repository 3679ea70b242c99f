"""The collective weight transport into vLLM and SGLang servers (docs/engines.md §4): the
adapters' weight-group routes, in order and with the documented bodies, against stand-in
servers in their own processes that join the learner's group on the init route and take one
broadcast per announced tensor on the update route (tests/integration/_fake_weight_engine.py).
The engine then holds exactly the bytes the learner announced."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests
import torch

from mutualrl.see.server import free_port
from mutualrl.services.rollout.http_engines import SGLangServerEngine, VLLMServerEngine
from mutualrl.weights import CollectiveSender, GroupChannel, TensorManifest, tensor_checksum, weight_group
from mutualrl.weights.groups import VLLMNcclChannel, learner_sender

FAKE = Path(__file__).with_name("_fake_weight_engine.py")


@pytest.fixture
def fake_engine():
    procs = []

    def start(kind: str, version: str) -> str:
        proc = subprocess.Popen([sys.executable, str(FAKE), kind, version], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        return f"http://127.0.0.1:{int(proc.stdout.readline())}"

    yield start
    for p in procs:
        p.kill()
        p.wait()


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embed.weight": torch.randn(12, 4, generator=g),
            "norm.weight": torch.randn(4, generator=g).to(torch.bfloat16)}


def _join(make_sender, join) -> CollectiveSender:
    """Both ends join at once, as the two services do at start-up."""
    out: dict = {}
    th = threading.Thread(target=lambda: out.update(sender=make_sender()))
    th.start()
    join()
    th.join(timeout=60)
    return out["sender"]


def _publish(sender: CollectiveSender, engine, version: int, state) -> tuple[str, str]:
    """The learner announces and broadcasts; the rollout service's follower calls the engine's
    update route on the announcement (the route returns once the broadcast is taken)."""
    box: dict = {}

    def announce(uri, checksum, manifest):
        def take():
            try:
                engine.update_weights(version, uri, checksum, manifest)
            except BaseException as e:  # noqa: BLE001
                box["error"] = e
        box["thread"] = threading.Thread(target=take)
        box["thread"].start()

    uri, checksum = sender.publish("p", version, state, announce)
    box["thread"].join(timeout=60)
    if "error" in box:
        raise box["error"]
    return uri, checksum


def _server_state(url: str) -> dict:
    return requests.get(f"{url}/_state", timeout=10).json()


def test_sglang_takes_the_learners_broadcast_through_its_distributed_update_route(fake_engine):
    url = fake_engine("sglang", "0.5.23")
    eng = SGLangServerEngine(url, "m", eos_id=2).probe()
    assert eng.weight_receivers() == 1
    port = free_port()
    sender = _join(lambda: learner_sender("sglang", "127.0.0.1", port, 1, "gloo", 60),
                   lambda: eng.join_weight_group("127.0.0.1", port, 2, backend="gloo"))
    for version in (1, 2):
        state = _state(version)
        uri, checksum = _publish(sender, eng, version, state)
        seen = _server_state(url)
        assert uri == f"collective://p/{version}"
        assert seen["received"] == checksum == tensor_checksum(state)
        assert seen["version"] == str(version)
        assert eng.info().weights_version == version
    calls = seen["calls"]
    per_version = ["/pause_generation", "/update_weights_from_distributed", "/continue_generation"]
    assert calls[calls.index("/init_weights_update_group"):] == ["/init_weights_update_group"] + per_version * 2
    with pytest.raises(ValueError, match="not newer"):  # refused before any route is called
        eng.update_weights(2, "collective://p/2", None, TensorManifest.of(_state(2)))
    with pytest.raises(ValueError, match="manifest"):
        eng.update_weights(3, "collective://p/3", None, None)
    assert _server_state(url)["calls"] == calls


@pytest.mark.parametrize("version,four_phase", [("0.33.0", True), ("0.27.1", True), ("0.20.0", False)])
def test_vllm_takes_the_learners_broadcast_through_its_weight_transfer_routes(fake_engine, version, four_phase):
    url = fake_engine("vllm", version)
    eng = VLLMServerEngine(url, "m", eos_id=2).probe()
    assert eng.weight_receivers() == 1
    port = free_port()
    # the learner's side of vLLM's group is vLLM's own PyNccl (GPU only); a gloo group with the same wire stands in for
    # it
    sender = _join(lambda: CollectiveSender(lambda v, g=GroupChannel(weight_group("127.0.0.1", port, 0, 2, "gloo",
        60)): g),
                   lambda: eng.join_weight_group("127.0.0.1", port, 2))
    state = _state(7)
    _, checksum = _publish(sender, eng, 1, state)
    seen = _server_state(url)
    assert seen["received"] == checksum == tensor_checksum(state) and eng.info().weights_version == 1
    steps = ["/pause", "/start_weight_update", "/update_weights", "/finish_weight_update", "/reset_prefix_cache",
             "/resume"]
    if not four_phase:
        # before 0.22: no start/finish, and no weight versions
        steps = ["/pause", "/update_weights", "/reset_prefix_cache", "/resume"]
    assert seen["calls"][seen["calls"].index("/init_weight_transfer_engine") + 1:] == steps
    if four_phase:
        assert seen["version"] == "1"  # published by finish_weight_update, only after the update succeeded


def test_an_engine_that_has_not_joined_the_group_refuses_a_collective_version(fake_engine):
    eng = SGLangServerEngine(fake_engine("sglang", "0.5.23"), "m", eos_id=2).probe()
    with pytest.raises(RuntimeError, match="has not joined"):
        eng.update_weights(1, "collective://p/1", None, TensorManifest.of(_state(1)))


def test_the_vllm_sender_says_what_it_needs_without_vllm():
    import importlib.util

    if importlib.util.find_spec("vllm") is not None and importlib.util.find_spec("vllm.distributed") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(RuntimeError, match="needs the vllm package"):
        VLLMNcclChannel("127.0.0.1", free_port(), 2, "cuda")
