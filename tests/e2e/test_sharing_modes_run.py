"""Every sharing mode (and each variant) trains through ``mutualrl run --set sharing.mode=...``
(the CLI app, invoked in-process):
5 steps of the demo config, finite losses and gradients, and the mode's peer signal
actually reaches the learner (peer rows, peer stats or rescues)."""

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mutualrl.app.cli import app

ROOT = Path(__file__).resolve().parents[2]

CASES = {
    "none": [],
    "naive": [],
    "prp": [],
    "prp-token": ["sharing.prp.ratio_level=token", "sharing.prp.truncation=2"],
    "xgrpo": [],
    "xgrpo-calibrated": ["sharing.xgrpo.variant=calibrated"],
    "xgrpo-leave-self-out": ["sharing.xgrpo.variant=leave_self_out"],
    "sgt": [],  # the demo's: the unguarded NLL, shortest success first
    "sgt-chord": ["sharing.sgt.guard=chord", "sharing.sgt.select=any"],  # the style-guarded NLL, SGT's default
    "sgt-group-insert": ["sharing.sgt.variant=group_insert"],
    "hacpo": ["algorithm.minibatch_rows=64", "algorithm.kl_coef=0.001"],
    "none-gspo": ["algorithm.loss=gspo", "algorithm.loss_agg=seq-mean-token-mean"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_mode_trains_five_steps(case, tmp_path):
    mode = case.split("-")[0]
    sets = [f"sharing.mode={mode}", "budget.steps=5", "budget.prompts_per_step=16", "eval.every=5", "eval.size=32",
            *CASES[case]]
    args = ["run", str(ROOT / "examples" / "demo.yaml"), "--out", str(tmp_path / case)]
    for s in sets:
        args += ["--set", s]
    # in-process (the same CLI entry point), so the twelve runs share one torch/transformers import
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (result.output[-3000:], result.exception)
    records = [json.loads(l) for l in (tmp_path / case / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("phase") != "warm_start"]
    assert len(steps) == 10  # 5 steps x 2 policies
    for r in steps:
        assert math.isfinite(r["loss"]) and r["grad_norm"] is not None and math.isfinite(r["grad_norm"]), r
        assert not any(isinstance(v, float) and math.isnan(v) for v in r.values()), r
        assert r["weights_version"] == r["step"]
    if mode in ("naive", "prp", "hacpo"):
        assert all(r["peer_rows"] > 0 for r in steps)  # converted peer rollouts were trained on
        assert all(r["thl_residual"] <= 0.02 for r in steps)
    if mode == "xgrpo":
        assert all(r["shared_in"] == 16 for r in steps)  # one AdvantageStats per prompt from the peer
    if mode == "sgt":
        assert sum(r["rescue_count"] for r in steps) > 0
    if mode == "hacpo":
        assert all(r["updates"] == 4 for r in steps)  # 128 self + 128 cross rows in mini-batches of 64
        assert all(r["cross_rows"] > 0 and 0 < r["omega_mean"] for r in steps)
    if mode == "none":
        assert all(r["shared_in"] == 0 and r["peer_rows"] == 0 for r in steps)
