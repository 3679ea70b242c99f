"""A pretrained policy that cannot produce the answer form the task asks for is told about before RL: a
WARNING and a `summary.json` field saying GRPO may have no signal, with the pass rate 0 of n cannot rule out
and the formats under which its completions would have scored (a model loaded by path counts as pretrained;
here a tiny one, asked for <answer> tags it has never seen)."""

import json

import yaml
from typer.testing import CliRunner

from mutualrl.app.cli import app
from mutualrl.models import build_model
from mutualrl.models.families import ModelShape


def test_a_policy_at_zero_percent_is_warned_about_and_summarised(tmp_path, tokenizers):
    tok = tokenizers["char"]
    ids = {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    model = build_model("llama", len(tok), ModelShape(hidden_size=32, num_layers=2, num_heads=4,
                                                      intermediate_size=64, max_positions=64), ids, seed=0)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    cfg = {"name": "no-signal", "seed": 0,
           "policies": [{"name": "tiny", "model": {"path": str(folder)}, "prompt": {"style": "bare"}}],
           "task": {"name": "arithmetic", "answer_format": "answer_tags", "train_size": 200, "eval_size": 16},
           "sharing": {"mode": "none"}, "tracking": {"backends": ["jsonl"]},
           "budget": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
           "eval": {"every": 1, "size": 4, "pass_rate_problems": 8}}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, (result.output[-3000:], result.exception)
    # the policy is named: its bracketed name printed as text, not taken for a style
    assert "[tiny] WARNING: 0 of 8 sampled answers pass in answer format answer_tags" in result.output
    pr = json.loads((tmp_path / "run" / "summary.json").read_text())["policies"]["tiny"]["pass_rate_before_rl"]
    assert pr["problems"] == 8 and pr["passed"] == 0 and pr["no_signal"] == "GRPO may have no signal on this task " \
        "for this policy"
    # 0 of 8 cannot rule out a pass rate up to 1 − 0.05^(1/8) ≈ 31 %: the warning says so instead of a verdict
    assert pr["rate_upper95"] == 0.3123
    assert "up to 31 % at 95 % confidence" in " ".join(result.output.split())
    assert set(pr["other_formats"]) == {"whole", "last_number", "boxed", "last_line"}
    assert isinstance(pr["better_formats"], list)
    rec = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert rec["signal_groups"] == 0 and rec["no_signal_steps"] == 1
