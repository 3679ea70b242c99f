"""`mutualrl mwra simulate`, `mutualrl controller` and `mutualrl up`'s plan, as a user runs them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "mutualrl.app.cli"]


def test_simulate_json(tmp_path):
    p = subprocess.run([*CLI, "mwra", "simulate", "--policies", "3", "--gpus", "24", "--cost-ratio", "4", "--seed", "1",
                        "--steps", "60", "--json",
                        "--plot", str(tmp_path / "p.png")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert set(doc["strategies"]) == {"equal", "proportional", "mwra", "best_static"}
    for s in doc["strategies"].values():
        assert {"makespan_over_lower_bound", "makespan_over_gang_bound", "gang_lower_bound_s", "utilisation",
                "replans", "partial_gang_gpu_seconds"} <= set(s)
        # the gang-aware bound is at least the plain one, so a makespan is nearer to it
        assert s["gang_lower_bound_s"] >= s["lower_bound_s"] - 1e-9
        assert s["makespan_over_gang_bound"] <= s["makespan_over_lower_bound"] + 1e-9
    assert doc["strategies"]["mwra"]["partial_gang_gpu_seconds"] == 0
    assert (tmp_path / "p.png").stat().st_size > 1000
    p = subprocess.run([*CLI, "mwra", "simulate", "--policies", "5", "--gpus", "40", "--steps", "20", "--json",
                        "--plot", str(tmp_path / "q.png")],
                       capture_output=True, text=True, timeout=120)
    assert json.loads(p.stdout)["strategies"]["best_static"] is None  # brute force only for N <= 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str | None = None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_controller_serves_over_http_with_the_token_from_a_file(tmp_path):
    (tmp_path / "token").write_text("file-token\n")
    port = _free_port()
    env = {**os.environ, "MUTUALRL_API_TOKEN_FILE": str(tmp_path / "token")}
    env.pop("MUTUALRL_API_TOKEN", None)
    proc = subprocess.Popen([*CLI, "controller", "--host", "127.0.0.1", "--port", str(port), "--backend", "memory",
                             "--gpus", "16"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if _get(base + "/healthz")[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        assert _get(base + "/healthz")[0] == 200
        assert b"mutualrl_mwra_plan_lower_bound_ratio" in _get(base + "/metrics")[1]
        assert "/v1/experiments" in json.loads(_get(base + "/openapi.json")[1])["paths"]
        assert _get(base + "/v1/experiments")[0] == 401
        assert _get(base + "/v1/experiments", "file-token") == (200, b"[]")
    finally:
        proc.terminate()
        proc.wait(10)


def test_controller_without_a_token_exits_2():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUTUALRL_API_TOKEN")}
    p = subprocess.run([*CLI, "controller", "--backend", "memory"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "MUTUALRL_API_TOKEN" in p.stderr


def test_up_refuses_a_policy_that_does_not_fit_even_on_shared_gpus_in_one_line(tmp_path):
    t0 = time.monotonic()
    p = subprocess.run([*CLI, "up", str(ROOT / "examples" / "demo.yaml"), "--out", str(tmp_path / "o"), "--set",
                        "mwra.gpus=2",
                        "--set", "policies.0.resources.learner_gpus=3"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "'llama-char' needs 3 GPUs at once" in lines[0] and "this host has 2" in lines[0]
    assert time.monotonic() - t0 < 30


def test_up_refuses_nccl_weights_between_services_that_share_a_gpu_in_one_line(tmp_path):
    """One GPU, two policies: the services share it, and NCCL cannot join two processes on one device."""
    p = subprocess.run([*CLI, "up", str(ROOT / "examples" / "demo.yaml"), "--out", str(tmp_path / "o"),
                        "--set", "mwra.gpus=1", "--set", "weights.transport=collective",
                        "--set", "policies.0.engine.device=cuda", "--set", "policies.1.engine.device=cuda"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "cannot join a learner and an hf engine on the same GPU" in lines[0]
    assert "llama-char, qwen-bpe" in lines[0] and "weights.transport=filesystem" in lines[0]


def test_up_with_an_unreachable_broker_exits_2_fast_in_one_line(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    p = subprocess.run([*CLI, "up", str(ROOT / "examples" / "demo.yaml"), "--out", str(tmp_path / "o"), "--set",
                        "broker.backend=redis",
                        "--set", f"broker.url=redis://127.0.0.1:{port}/0"], capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "cannot reach Redis" in lines[0], p.stdout + p.stderr
    assert elapsed < 5, elapsed  # the broker is checked before anything is planned or imported
