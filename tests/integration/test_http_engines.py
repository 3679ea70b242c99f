"""Contract tests of the vLLM and SGLang adapters against stand-in HTTP servers that answer
the documented routes (docs/engines.md §2, §3): neither engine runs without a GPU, so the
adapters are thin and these tests pin down exactly what they send and how they read answers."""

import threading
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest
import torch
from json_http import json_handler

from mutualrl.services.rollout.engine import SamplingSpec
from mutualrl.services.rollout.http_engines import EngineUnavailable, SGLangServerEngine, VLLMServerEngine
from mutualrl.weights import WeightStore

EOS = 2
VLLM_SAMPLING_KEYS = {"model", "prompt", "n", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
                      "logprobs", "return_token_ids"}
SGLANG_SAMPLING_KEYS = {"n", "max_new_tokens", "temperature", "top_p", "top_k", "min_p"}


class Fake:
    """A stand-in server: ``routes`` maps (method, path) to a handler(body, query) -> (code, json)."""

    def __init__(self, routes):
        self.calls: list[tuple[str, str, dict]] = []

        def respond(method, path, query, body):
            self.calls.append((method, path, body))
            handler = routes.get((method, path))
            return handler(body, parse_qs(query)) if handler else (404, {"detail": "Not Found"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), json_handler(respond))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def posts(self):
        return [p for m, p, _ in self.calls if m == "POST"]

    def close(self):
        self.httpd.shutdown()


def _vllm_routes(dev_mode=True):
    def completions(body, q):
        if not VLLM_SAMPLING_KEYS <= body.keys() or body["logprobs"] != 0:
            return 400, {"error": f"missing fields {VLLM_SAMPLING_KEYS - body.keys()}"}
        choices = []
        for i, _ in enumerate(body["prompt"]):
            for j in range(body["n"]):
                ids = [10 + i, 20 + j, EOS] if j % 2 == 0 else [10 + i, 20 + j, 30]
                choices.append({"index": len(choices), "token_ids": ids,
                                "finish_reason": "stop" if j % 2 == 0 else "length",
                                "logprobs": {"token_logprobs": [-0.1, -0.2, -0.3],
                                             "tokens": [f"token_id:{t}" for t in ids]}})
        return 200, {"choices": list(reversed(choices))}  # order must come from `index`

    routes = {
        ("GET", "/version"): lambda b, q: (200, {"version": "0.33.0"}),
        ("GET", "/health"): lambda b, q: (200, {}),
        ("GET", "/weight_info"): lambda b, q: (200, {"weight_version": "default"}),
        ("POST", "/v1/completions"): completions,
    }
    if dev_mode:
        routes.update({
            ("GET", "/is_paused"): lambda b, q: (200, {"is_paused": False}),
            ("POST", "/pause"): lambda b, q: (200, {"status": "paused"}) if q.get("mode") == ["keep"] else (400, {}),
            ("POST", "/collective_rpc"): lambda b, q: (
                (200, {"results": [None]}) if b.get("method") == "reload_weights" and b["kwargs"]["weights_path"]
                else (400, {})),
            ("POST", "/reset_prefix_cache"): lambda b, q: (200, {"success": True}),
            ("POST", "/update_weight_version"): lambda b, q: (200, {}),
            ("POST", "/resume"): lambda b, q: (200, {}),
        })
    return routes


def _sglang_routes():
    def generate(body, q):
        sp = body["sampling_params"]
        if not SGLANG_SAMPLING_KEYS <= sp.keys() or not body.get("return_logprob"):
            return 400, {"error": "missing fields"}
        out = []
        for k, ids in enumerate(body["input_ids"]):
            toks = [100 + k, EOS]
            out.append({"text": "", "output_ids": toks,
                        "meta_info": {"output_token_logprobs": [[-0.5, t, None] for t in toks],
                                      "finish_reason": {"type": "stop"}}})
        return 200, out

    def from_disk(body, q):
        import os

        ok = os.path.isfile(os.path.join(body["model_path"],
                                         "config.json")) and os.path.isfile(os.path.join(body["model_path"],
            "model.safetensors"))
        return 200, {"success": ok, "message": "ok" if ok else "not a checkpoint"}

    return {
        ("GET", "/server_info"): lambda b, q: (200, {"version": "0.5.23", "enable_deterministic_inference": False}),
        ("GET", "/model_info"): lambda b, q: (200, {"weight_version": "0"}),
        ("GET", "/health"): lambda b, q: (200, {}),
        ("POST", "/generate"): generate,
        ("POST", "/pause_generation"): lambda b, q: (200, {}),
        ("POST", "/update_weights_from_disk"): from_disk,
        ("POST", "/continue_generation"): lambda b, q: (200, {}),
    }


@pytest.fixture
def checkpoint(tmp_path):
    from transformers import LlamaConfig

    store = WeightStore(tmp_path)
    cfg = LlamaConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    uri, checksum = store.put("a", 1, {"w": torch.ones(2, 2)}, model_config=cfg)
    return uri, checksum


def test_vllm_generate_sends_every_sampling_field_and_groups_prompt_major():
    fake = Fake(_vllm_routes())
    try:
        eng = VLLMServerEngine(fake.url, "M", eos_id=EOS).probe()
        info = eng.info()
        assert (info.engine, info.engine_version, info.weights_version) == ("vllm", "0.33.0", 0)
        groups = eng.generate([[1, 2], [3]], SamplingSpec(n=2, max_new_tokens=3, temperature=1.0, seed=5))
        assert [[s.token_ids for s in g] for g in groups] == [[[10, 20, EOS], [10, 21, 30]],
            [[11, 20, EOS], [11, 21, 30]]]
        assert groups[0][0].finish_reason == "stop" and groups[0][1].finish_reason == "length"
        assert groups[1][1].logprobs == pytest.approx([-0.1, -0.2, -0.3])
        sent = next(b for m, p, b in fake.calls if p == "/v1/completions")
        assert sent["top_k"] == -1 and sent["seed"] == 5 and sent["prompt"] == [[1, 2], [3]]
    finally:
        fake.close()


def test_vllm_update_is_pause_reload_reset_version_resume(checkpoint):
    uri, checksum = checkpoint
    fake = Fake(_vllm_routes())
    try:
        eng = VLLMServerEngine(fake.url, "M", eos_id=EOS).probe()
        with pytest.raises(ValueError, match="checksum"):
            eng.update_weights(1, uri, "0" * 64)
        with pytest.raises(ValueError, match="checkpoint directory"):
            eng.update_weights(1, "inproc://a/1")
        assert fake.posts() == []  # nothing reached the engine
        eng.update_weights(1, uri, checksum)
        assert fake.posts() == ["/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/resume"]
        rpc = next(b for m, p, b in fake.calls if p == "/collective_rpc")
        assert rpc["kwargs"] == {"weights_path": uri, "is_checkpoint_format": True}
        assert eng.info().weights_version == 1
        with pytest.raises(ValueError, match="not newer"):
            eng.update_weights(1, uri)
    finally:
        fake.close()


def test_vllm_without_dev_mode_or_server_refuses_to_start():
    fake = Fake(_vllm_routes(dev_mode=False))
    try:
        with pytest.raises(EngineUnavailable, match="VLLM_SERVER_DEV_MODE=1"):
            VLLMServerEngine(fake.url, "M", eos_id=EOS).probe()
    finally:
        fake.close()
    from mutualrl.see.server import free_port

    with pytest.raises(EngineUnavailable, match="no vLLM server"):
        VLLMServerEngine(f"http://127.0.0.1:{free_port()}", "M", eos_id=EOS).probe()


def test_sglang_generate_repeats_prompts_and_reads_meta_info():
    fake = Fake(_sglang_routes())
    try:
        eng = SGLangServerEngine(fake.url, "M", eos_id=EOS).probe()
        assert eng.info().engine_version == "0.5.23"
        groups = eng.generate([[1, 2], [3]], SamplingSpec(n=2, max_new_tokens=3))
        sent = next(b for m, p, b in fake.calls if p == "/generate")
        assert sent["input_ids"] == [[1, 2], [1, 2], [3], [3]] and sent["sampling_params"]["n"] == 1
        assert "sampling_seed" not in sent["sampling_params"]  # honoured only with deterministic inference
        assert [[s.token_ids for s in g] for g in groups] == [[[100, EOS], [101, EOS]], [[102, EOS], [103, EOS]]]
        assert all(s.finish_reason == "stop" and s.logprobs == [-0.5, -0.5] for g in groups for s in g)
    finally:
        fake.close()


def test_sglang_update_from_disk_inside_pause_and_continue(checkpoint, tmp_path):
    uri, checksum = checkpoint
    fake = Fake(_sglang_routes())
    try:
        eng = SGLangServerEngine(fake.url, "M", eos_id=EOS).probe()
        eng.update_weights(1, uri, checksum)
        assert fake.posts() == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"]
        body = next(b for m, p, b in fake.calls if p == "/update_weights_from_disk")
        assert body["weight_version"] == "1" and body["flush_cache"] is True
        assert eng.info().weights_version == 1
        bare = WeightStore(tmp_path / "bare").put("a", 2, {"w": torch.ones(1)})[0]  # no config.json: the engine says no
        with pytest.raises(RuntimeError, match="not a checkpoint"):
            eng.update_weights(2, bare)
        assert eng.info().weights_version == 1 and fake.posts()[-1] == "/continue_generation"  # resumed anyway
    finally:
        fake.close()


def test_run_with_an_absent_engine_server_fails_fast_with_one_line(tmp_path):
    from pathlib import Path

    from typer.testing import CliRunner

    from mutualrl.app.cli import app
    from mutualrl.see.server import free_port

    demo = Path(__file__).resolve().parents[2] / "examples" / "demo.yaml"
    result = CliRunner().invoke(app,
                                ["run", str(demo), "--out", str(tmp_path), "--set", "policies.0.engine.backend=vllm",
                                 "--set", f"policies.0.engine.url=http://127.0.0.1:{free_port()}"])
    assert result.exit_code == 2
    assert "llama-char" in result.output and "no vLLM server" in result.output
