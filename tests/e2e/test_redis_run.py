"""`mutualrl run --set broker.backend=redis` (a local server started for the run) trains exactly
as the in-process run does: same seeds, same messages, same numbers."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mutualrl.app.cli import app

ROOT = Path(__file__).resolve().parents[2]


def _run(out: Path, *sets: str) -> list[dict]:
    args = ["run", str(ROOT / "examples" / "demo.yaml"), "--out", str(out), "--set", "budget.steps=3", "--set",
            "eval.every=3", "--set", "eval.size=32"]
    for s in sets:
        args += ["--set", s]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (result.output[-3000:], result.exception)
    return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]


def test_redis_backend_trains_like_the_in_process_backend(tmp_path, redis_server):
    inproc = _run(tmp_path / "inproc")
    local = _run(tmp_path / "redis-local", "broker.backend=redis")  # starts and stops its own server
    shared = _run(tmp_path / "redis-url", "broker.backend=redis", f"broker.url={redis_server.url}")
    keys = ("policy", "step", "reward_mean", "loss", "rescue_count", "shared_in", "eval_accuracy")
    for other in (local, shared):
        assert len(other) == len(inproc)
        for a, b in zip(inproc, other):
            for k in keys:
                assert a.get(k) == pytest.approx(b.get(k)), (k, a, b)
    assert sum(r.get("rescue_count") or 0 for r in shared) > 0  # experience really crossed through Redis


def test_unreachable_redis_is_a_clear_error(tmp_path):
    from mutualrl.see.server import free_port

    result = CliRunner().invoke(app,
                                ["run", str(ROOT / "examples" / "demo.yaml"), "--out", str(tmp_path), "--set",
                                 "broker.backend=redis",
                                 "--set", f"broker.url=redis://127.0.0.1:{free_port()}/0", "--set",
                                 "budget.steps=1"])
    assert result.exit_code == 2
    assert "cannot reach Redis" in result.output
