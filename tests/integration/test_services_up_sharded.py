"""`mutualrl up` with a sharded learner: ``resources.learner_gpus: 2`` on a CPU host runs the
llama-char learner on 2 gloo ranks (FSDP2) — the learner service is rank 0 and starts rank 1
itself — and a kill -9 of the learner takes both ranks down and resumes both from their shards."""

import json
import os
import signal

import pytest
import torch
from test_services_up import _finish, _ledgers, _start, _wait_for_step

SHARDED = "policies.llama-char.resources.learner_gpus=2"


@pytest.mark.slow  # a minute of two ranks under `up`; the sharded learner itself is in test_fsdp_learner.py
def test_a_two_rank_learner_trains_checkpoints_and_resumes_under_up(tmp_path):
    out = tmp_path / "run"
    proc = _start(out, 5, SHARDED)
    try:
        _wait_for_step(out, "llama-char.learner", 2, "learner step 2")
        assert (out / "services" / "llama-char.learner.state.r1.pt").is_file()  # rank 1 checkpoints its own shards
        os.kill(int((out / "services" / "llama-char.learner.pid").read_text()), signal.SIGKILL)
        output = _finish(proc)
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-3000:]
    log = (out / "logs" / "llama-char.learner.log").read_text()
    assert '"msg": "sharded learner", "ranks": 2' in log and "resumed" in log
    assert "llama-char.learner exited with -9; restarting" in output
    ledger, published = _ledgers(out, "llama-char")
    assert sorted(ledger) == list(range(1, 6))
    for s in range(1, 6):  # nothing lost or trained twice across the kill
        assert set(ledger[s]["own"]) == set(published[s])
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    mine = [r for r in records if r["policy"] == "llama-char" and r.get("phase") != "warm_start"]
    assert [r["step"] for r in mine] == [1, 2, 3, 4, 5] and all(r["grad_norm"] and r["grad_norm"] > 0 for r in mine)
    # the final checkpoint is the whole model, loadable without any process group
    state = json.loads((out / "checkpoints" / "llama-char" / "trainer_state.json").read_text())
    assert state["ranks"] == 2
    from safetensors.torch import load_file

    weights = load_file(str(out / "checkpoints" / "llama-char" / "model.safetensors"))
    emb = next(v for k, v in weights.items() if "embed" in k)
    assert emb.shape[0] > 10 and torch.isfinite(emb).all()
