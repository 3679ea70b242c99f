"""End to end through the CLI: the demo config for a few steps writes every output,
trains both policies (parameters changed, rewards recorded) and crosses experience."""

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]


def test_demo_config_short_run(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "mutualrl.app.cli", "run", str(ROOT / "examples" / "demo.yaml"),
           "--set", "budget.steps=4", "--set", "budget.prompts_per_step=16", "--set", "eval.every=2", "--set",
           "eval.size=64", "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]

    for name in ("config.yaml", "metrics.jsonl", "curves.png", "summary.json"):
        assert (out / name).is_file(), name
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("phase") != "warm_start"]
    assert {(r["policy"], r["step"]) for r in steps} == {(p, s) for p in ("llama-char", "qwen-bpe") for s in range(1,
        5)}
    required = {"step", "policy", "rollouts", "reward_mean", "loss", "kl", "clip_frac", "shared_in", "shared_out",
                "thl_residual", "step_s"}
    for r in steps:
        assert required <= r.keys()
        assert all(v is not None for k, v in r.items() if k in required)
        assert 0.0 <= r["reward_mean"] <= 1.0
    assert sum(1 for r in steps if "eval_accuracy" in r) == 4  # steps 2 and 4, two policies
    assert steps[-1]["rollouts"] == 4 * 16 * 8

    summary = json.loads((out / "summary.json").read_text())
    for name, pol in summary["policies"].items():
        assert 0.0 <= pol["warm_start_accuracy"] <= 1.0 and 0.0 <= pol["final_accuracy"] <= 1.0
        assert pol["warm_start_steps"] > 0
    # both policies published verified successes; at least one rescue crossed tokenizers
    assert sum(r["shared_out"] for r in steps) > 0
    assert sum(p["rescue_count"] for p in summary["policies"].values()) > 0

    # parameters moved away from the warm start, and the checkpoint reloads as a HF model
    from mutualrl.models import load_policy

    for name in ("llama-char", "qwen-bpe"):
        ck = out / "checkpoints" / name
        reloaded = load_policy(path=str(ck))
        state = json.loads((ck / "trainer_state.json").read_text())
        assert state["weights_version"] == 4
        warm = _warm_state(name, summary)
        changed = [k for k, v in reloaded.model.state_dict().items() if k in warm and not torch.equal(v, warm[k])]
        assert changed, f"{name}: parameters did not change"


def _warm_state(name: str, summary: dict) -> dict:
    import os

    cache = Path(os.environ["MUTUALRL_CACHE"]) / "warm"
    # the warm start entry of this policy is the one whose weights fit its parameter count
    for entry in cache.iterdir():
        st = load_file(str(entry / "model.safetensors"))
        if sum(v.numel() for k, v in st.items() if "lm_head" not in k) == summary["policies"][name]["params"]:
            return st
    raise AssertionError(f"no warm start found for {name}")
