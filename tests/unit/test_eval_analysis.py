"""Per-problem evaluations: the paired difference problem by problem, and the style of the answers."""

import json

import pytest

from mutualrl.runtime.eval_analysis import (
    SHAPE_CHARS,
    answer_shape,
    answer_shapes,
    answer_style,
    correct_by_problem,
    per_problem_by_seed,
    per_problem_paired,
    read_evals,
)


def test_the_per_problem_paired_difference_averages_seeds_inside_each_problem_then_spans_the_problems():
    entry = {0: {"a": 1, "b": 1, "c": 0}, 1: {"a": 1, "b": 0, "c": 0}}
    base = {0: {"a": 0, "b": 1, "c": 0}, 1: {"a": 0, "b": 0, "c": 1}, 2: {"a": 1, "b": 1, "c": 1}}
    out = per_problem_paired(entry, base)
    # per problem over seeds 0 and 1: a (1+1)/2 = 1, b (0+0)/2 = 0, c (0-1)/2 = -0.5
    assert out["mean"] == pytest.approx(0.5 / 3) and out["problems"] == 3 and out["seeds"] == 2
    diffs = [1.0, 0.0, -0.5]
    m = sum(diffs) / 3
    sd = (sum((d - m) ** 2 for d in diffs) / 2) ** 0.5
    assert out["ci95"] == pytest.approx(4.303 * sd / 3 ** 0.5, rel=1e-3)  # t(0.975, 2 df)
    assert per_problem_paired({5: {"a": 1}}, base) is None  # no seed in common


def test_answer_style_counts_length_form_and_shown_work():
    texts = ["12 + 34 = 46. <answer>46</answer>", "46", "<answer>4</answer>"]
    st = answer_style(texts, "answer_tags")
    assert st["chars"] == pytest.approx(sum(map(len, texts)) / 3)
    assert st["in_form"] == pytest.approx(2 / 3) and st["shows_work"] == pytest.approx(1 / 3)
    assert answer_style([], "answer_tags")["chars"] is None
    assert st["cut_off"] is None  # a log written before the cut-off bits
    assert answer_style(texts, "answer_tags", "100")["cut_off"] == pytest.approx(1 / 3)


def test_an_answers_shape_keeps_its_wording_and_drops_its_numbers():
    # pair A, seed 4: SGT's SmolLM2 took up the Qwen's "equals"; length, form and shown work barely saw it
    assert answer_shape("9 + 5 equals 14.") == answer_shape("33 + 17  equals\n40.") == "# + # equals #."
    assert answer_shape("9 + 5 = 14") == "# + # = #" and answer_shape("-3.5 - 2") == "# - #"
    long = answer_shape("step " * 40)
    assert len(long) == SHAPE_CHARS and long.endswith("…")


def test_answer_shapes_are_the_most_common_with_their_shares():
    texts = ["9 + 5 = 14", "1 + 2 = 3", "9 + 5 equals 14.", "7", "2 + 2 = 4", "8"]
    assert answer_shapes(texts, top=2) == {"# + # = #": pytest.approx(0.5), "#": pytest.approx(2 / 6)}
    assert answer_shapes([]) == {}


def test_evaluation_logs_read_in_step_order_and_skip_a_cut_line(tmp_path):
    f = tmp_path / "evals.jsonl"
    lines = [{"step": 2, "prompt_ids": ["a", "b"], "correct": "10", "texts": ["x", "y"]},
             {"step": 0, "prompt_ids": ["a", "b"], "correct": "01", "texts": ["x", "y"]}]
    f.write_text("\n".join(json.dumps(x) for x in lines) + '\n{"step": 4, "prompt_')
    evals = read_evals(f)
    assert [e["step"] for e in evals] == [0, 2]
    assert correct_by_problem(evals[-1]) == {"a": 1, "b": 0}
    assert read_evals(tmp_path / "none.jsonl") == []


def test_seeds_with_their_own_held_out_sets_pair_each_seed_and_problem():
    """A task drawn per seed evaluates other problems under each seed: intersecting them would keep the few they
    share by chance (15 of 128 on SmolLM2's sums), so every (seed, problem) pair counts on its own."""
    entry = {0: {"a": 1, "b": 0, "x": 1}, 1: {"c": 1, "d": 1, "x": 0}}
    base = {0: {"a": 0, "b": 0, "x": 1}, 1: {"c": 0, "d": 1, "x": 1}}
    out = per_problem_paired(entry, base)
    diffs = [1.0, 0.0, 0.0, 1.0, 0.0, -1.0]  # seed 0: a b x, seed 1: c d x
    assert out["per_seed_sets"] and out["problems"] == 6 and out["seeds"] == 2
    assert out["mean"] == pytest.approx(sum(diffs) / 6)
    same = per_problem_paired({0: {"a": 1, "b": 0}, 1: {"a": 1, "b": 1}}, {0: {"a": 0, "b": 0}, 1: {"a": 1, "b": 0}})
    assert same["problems"] == 2 and "per_seed_sets" not in same  # one shared set: the mean over seeds per problem


def test_each_seeds_own_paired_difference_shows_a_seed_the_pooled_mean_hides():
    """Pooled over the seeds the entry is ahead; seed 1 alone it lost."""
    entry = {0: {"a": 1, "b": 1, "c": 1}, 1: {"a": 0, "b": 1, "c": 1}, 2: {"a": 1, "b": 1, "c": 1}}
    base = {0: {"a": 0, "b": 0, "c": 0}, 1: {"a": 1, "b": 1, "c": 1}, 3: {"a": 0, "b": 0, "c": 0}}
    assert per_problem_paired(entry, base)["mean"] == pytest.approx(1 / 3)  # a (1-1)/2, b (1+0)/2, c (1+0)/2
    by_seed = per_problem_by_seed(entry, base)
    assert sorted(by_seed) == [0, 1]  # the seeds both have
    assert by_seed[0]["mean"] == pytest.approx(1.0) and by_seed[1]["mean"] == pytest.approx(-1 / 3)
    assert by_seed[1]["problems"] == 3 and by_seed[1]["seeds"] == 1
    assert by_seed[1] == per_problem_paired({1: entry[1]}, {1: base[1]})
    assert per_problem_by_seed(entry, {7: {"a": 1}}) == {}
