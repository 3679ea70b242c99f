"""benchmarks/bench_vs_trl.py's reading of a run's records: step rate and stage times between the first step's end and
the last's, and the learner's per-stage peak memory (the largest over the steps)."""

from __future__ import annotations

import json


def test_figures_time_the_steps_after_the_first_and_keep_each_stages_largest_peak(tmp_path, load_script):
    recs = [{"step": 0, "phase": "warm_start"},
            {"step": 1, "wall_time": 100.0, "tokens": 500, "gen_s": 9.0, "stage_seconds": {"train": 30.0},
             "stage_peak_rss_gib": {"intake": 3.0, "train": 4.5}, "reward_mean": 0.1},
            {"step": 2, "wall_time": 120.0, "tokens": 300, "gen_s": 6.0, "stage_seconds": {"train": 12.0},
             "stage_peak_rss_gib": {"intake": 3.5, "train": 4.0}, "reward_mean": 0.2},
            {"step": 3, "wall_time": 150.0, "tokens": 200, "gen_s": 8.0, "stage_seconds": {"train": 16.0},
             "stage_peak_rss_gib": {"intake": 3.2, "train": 4.1, "weight_sync": 3.1}, "reward_mean": 0.3}]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    fig = load_script("benchmarks/bench_vs_trl.py").ours(metrics)
    assert fig["step_s"] == 25.0 and fig["steps_per_s"] == 2 / 50  # steps 2 and 3, between step 1's end and 3's
    assert fig["tokens_per_s"] == 500 / 50
    assert fig["stages"] == {"train": 14.0, "generate": 7.0}  # the mean of steps 2 and 3
    assert fig["stage_peak_rss_gib"] == {"intake": 3.5, "train": 4.5, "weight_sync": 3.1}  # every step's, step 1's too
    assert fig["reward"] == [0.1, 0.2, 0.3]
