"""`mutualrl run` with SGT-R: the completions a receiver's engine samples in its rescue round are its rollouts too,
so an entry that rescues is compared with one that does not at the rollouts it really drew (docs/algorithms.md
§3.5): every record's ``rollouts`` and the summary's count them beside the policy's own groups."""

from pathlib import Path

import mutualrl.app.embedded as embedded
from mutualrl.config import load_config
from mutualrl.runtime.outputs import read_metrics

ROOT = Path(__file__).resolve().parents[2]


def test_rescue_samples_count_in_the_rollouts_of_the_records_and_the_summary(tmp_path):
    cfg = load_config(ROOT / "examples" / "demo.yaml", [
        "budget.steps=2", "budget.prompts_per_step=16", "eval.every=100", "eval.size=32", "sharing.mode=sgt_r",
        "sharing.sgt_r.min_gain=null", "sharing.sgt_r.max_prompts=3", "sharing.sgt_r.samples=2"])
    summary = embedded.run_embedded(cfg, tmp_path / "o")
    records = [r for r in read_metrics(tmp_path / "o" / "metrics.jsonl") if r.get("phase") != "warm_start"]
    rescued = 0
    for name in ("llama-char", "qwen-bpe"):
        mine = sorted((r for r in records if r["policy"] == name), key=lambda r: r["step"])
        assert [r["step"] for r in mine] == [1, 2]
        running = 0
        for r in mine:
            running += r["own_rollouts"] + (r["rescue_samples"] or 0)
            assert r["rollouts"] == running, (name, r["step"], r["rollouts"], running)
        assert summary["policies"][name]["rollouts"] == running
        rescued += sum(r["rescue_samples"] or 0 for r in mine)
    assert rescued > 0  # the rescue round ran: the count above is not only the own groups'
