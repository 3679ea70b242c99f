"""A real vLLM server (the CPU build, `make test-vllm`) behind our vLLM adapter: sampled log-probs
equal the policy's own (transformers) log-probs, and a weight reload through the dev routes
serves the new version. Skipped unless MUTUALRL_VLLM_PYTHON names an interpreter with vLLM."""

import os
import subprocess
import time

import pytest
import requests
import torch

from mutualrl.models import load_policy
from mutualrl.models.families import ModelShape
from mutualrl.models.generation import sequence_logprobs
from mutualrl.see.server import free_port
from mutualrl.services.rollout.engine import SamplingSpec
from mutualrl.services.rollout.http_engines import VLLMServerEngine
from mutualrl.weights import WeightStore

pytestmark = pytest.mark.vllm
PYTHON = os.environ.get("MUTUALRL_VLLM_PYTHON")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not PYTHON:
        pytest.skip("MUTUALRL_VLLM_PYTHON is not set (run `make test-vllm`)")
    from mutualrl.tasks import build_task

    root = tmp_path_factory.mktemp("vllm")
    task = build_task("arithmetic", seed=0, min_digits=1, max_digits=2, train_size=500, eval_size=16)
    # vLLM's CPU attention kernels need head_dim >= 32: hidden 128 over 2 heads
    arts = load_policy(family="llama", shape=ModelShape(128, 2, 2, 256, 64), tokenizer_kind="char", corpus=task.corpus,
                       corpus_fingerprint=task.fingerprint(), seed=1)
    model_dir = root / "model"
    arts.model.save_pretrained(model_dir)
    arts.tokenizer.save_pretrained(model_dir)
    port = free_port()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    cmd = [PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--port", str(port),
           "--dtype", "float32",
           "--max-model-len", "64", "--enforce-eager", "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1",
           "--seed", "0"]
    log = (root / "server.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vLLM server exited with {proc.returncode}: {(root / 'server.log').read_text()[-2000:]}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        time.sleep(2)
    else:
        proc.kill()
        pytest.fail("vLLM server did not become healthy")
    yield {"url": url, "arts": arts, "model_dir": model_dir, "root": root}
    proc.terminate()
    proc.wait(timeout=60)


def _max_logprob_gap(model, tok, prompts, groups) -> float:
    flat_p = [p for p, g in zip(prompts, groups) for _ in g]
    samples = [s for g in groups for s in g]
    lp, _ = sequence_logprobs(model, flat_p, [s.token_ids for s in samples], pad_id=tok.pad_token_id)
    T = lp.shape[1]
    return max(abs(a - b) for i, s in enumerate(samples) for a, b in zip(lp[i, T - len(s.token_ids) :].tolist(),
        s.logprobs))


def test_real_vllm_logprobs_equal_the_policy_and_reload_serves_new_weights(server):
    arts = server["arts"]
    model, tok = arts.model.eval(), arts.tokenizer
    eng = VLLMServerEngine(server["url"], str(server["model_dir"]), eos_id=tok.eos_token_id).probe()
    assert eng.info().engine == "vllm" and eng.info().capabilities["dev_mode"]
    prompts = [tok("Q: 1+2=")["input_ids"], tok("Q: 3+4=")["input_ids"]]
    groups = eng.generate(prompts, SamplingSpec(n=4, max_new_tokens=8, temperature=1.0, seed=1))
    assert [len(g) for g in groups] == [4, 4]
    for s in (s for g in groups for s in g):
        assert len(s.logprobs) == len(s.token_ids)
        assert s.finish_reason == "length" or s.token_ids[-1] == tok.eos_token_id
    with torch.no_grad():
        assert _max_logprob_gap(model, tok, prompts, groups) < 1e-4  # processed log-probs at T=1 are the policy's

    store = WeightStore(server["root"] / "weights")
    gen = torch.Generator().manual_seed(0)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}
    uri, checksum = store.put("a", 1, new, model_config=model.config)
    eng.update_weights(1, uri, checksum)
    assert eng.info().weights_version == 1
    model.load_state_dict(new)
    groups = eng.generate(prompts, SamplingSpec(n=4, max_new_tokens=8, temperature=1.0, seed=2))
    with torch.no_grad():
        assert _max_logprob_gap(model, tok, prompts, groups) < 1e-4  # the server samples from the new weights
