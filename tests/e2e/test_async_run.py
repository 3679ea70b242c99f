"""Pipelined sampling in the embedded run (docs/algorithms.md §6): with ``async.max_staleness: k`` the
rollouts of step s are sampled with the weights of step s−1−k, the learner trains them with the
decoupled objective, and the records say how stale they were."""

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mutualrl.app.cli import app

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("k", [1, 2])
def test_a_pipelined_embedded_run_trains_on_rollouts_exactly_k_versions_old(k, tmp_path):
    args = ["run", str(ROOT / "examples" / "demo.yaml"), "--out", str(tmp_path / "o")]
    for s in ["sharing.mode=sgt", "budget.steps=4", "budget.prompts_per_step=8", "eval.every=4", "eval.size=16",
              f"async.max_staleness={k}", "async.peers=bounded"]:
        args += ["--set", s]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (result.output[-3000:], result.exception)
    records = [json.loads(line) for line in (tmp_path / "o" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("phase") != "warm_start"]
    assert len(steps) == 8
    for r in steps:
        # step s was sampled with version max(0, s-1-k); the learner starts it at version s-1
        lag = (r["step"] - 1) - max(0, r["step"] - 1 - k)
        assert r["staleness_mean"] == r["staleness_max"] == lag, r
        assert r["own_too_stale"] == 0
        assert math.isfinite(r["loss"]) and r["grad_norm"] is not None and r["grad_norm"] > 0
        assert r["weights_version"] == r["step"]
        assert 0 < r["is_weight_mean"] <= 2.0 and 0 <= r["is_truncated_frac"] <= 1
        assert r["rollouts"] == 8 * 8 * r["step"]  # the rollouts of the steps trained so far
    assert any(r["is_weight_mean"] != pytest.approx(1.0, abs=1e-6) for r in steps if r["step"] > 1)
    config = (tmp_path / "o" / "config.yaml").read_text()
    assert "async:" in config and f"max_staleness: {k}" in config  # the resolved config reloads as written
