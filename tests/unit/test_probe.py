"""`mutualrl probe`'s figures: pass rates, the pick, and the completions the token limit ended (a verifier that
reads the last number of an unfinished explanation passes it by accident; app/probe.py's docstring)."""

from __future__ import annotations

import pytest

from mutualrl.app.probe import Cell, Tally, pick, probe, render, worked_instruction


def test_a_tally_counts_passes_cut_offs_and_passes_among_the_cut_offs():
    t = Tally()
    t.add([1.0, 0.0, 1.0, 0.0], [True, True, False, False])
    t.add([1.0, 0.0], [True, False])
    assert (t.completions, t.passed, t.cut_off, t.passed_cut_off) == (6, 3.0, 3, 2.0)
    assert t.rate == pytest.approx(0.5) and t.cut_off_share == pytest.approx(0.5)
    assert t.passes_cut_off_share == pytest.approx(2 / 3)
    both = t + Tally(2, 0.0, 2, 0.0)
    assert (both.completions, both.cut_off, both.passes_cut_off_share) == (8, 5, pytest.approx(2 / 3))
    assert Tally().rate == 0.0 and Tally().passes_cut_off_share == 0.0  # nothing scored, nothing passed


def _cell(policy: str, sampled: float, passes_cut_off: float, instruction: str = "task",
          style: str = "chat") -> Cell:
    return Cell(policy, "last_number", style, 24, sampled, sampled, 0.9, 1.0, 0.8, passes_cut_off, instruction,
                1.0 if instruction == "task" else 0.7)


def test_the_worked_instruction_asks_for_the_work_and_keeps_the_formats_answer_clause():
    assert worked_instruction("answer_tags") == ("Work it out step by step and write each intermediate result. "
                                                 "Give the final answer between <answer> and </answer>, with nothing "
                                                 "else inside the tags.")
    assert worked_instruction("last_number").endswith("Give the final answer as a number at the end of your reply.")


def test_worked_cells_take_no_part_in_the_pick_and_name_a_policy_cold_only_by_its_instruction():
    """The 0.5B Qwen's case (probe.py's docstring): 2 % under the task's instruction, 44 % told to show the work."""
    task_only = [_cell("qwen", 0.02, 0.0), _cell("peer", 0.5, 0.0)]
    worked = [_cell("qwen", 0.44, 0.0, "worked", "completion"), _cell("peer", 0.9, 0.0, "worked")]
    with_worked = pick(task_only + worked, ["qwen", "peer"], ("last_number",))
    alone = pick(task_only, ["qwen", "peer"], ("last_number",))
    assert {k: with_worked[k] for k in ("answer_format", "styles", "room", "overrides")} == \
        {k: alone[k] for k in ("answer_format", "styles", "room", "overrides")}
    assert alone["cold"] == {} and list(with_worked["cold"]) == ["qwen"]  # the peer is not cold: nothing said
    said = with_worked["cold"]["qwen"]
    assert "asked to show its work (completion, T 0.7) qwen samples 44%" in said
    assert "cold by its instruction, not by skill" in said and "policies.qwen.prompt.instruction" in said
    assert said in with_worked["note"]


def test_a_policy_that_stays_cold_when_worked_is_a_cold_start_in_skill():
    cells = [_cell("a", 0.0, 0.0), _cell("a", 0.02, 0.0, "worked"), _cell("b", 0.3, 0.0),
             _cell("b", 0.01, 0.0, "worked")]
    cold = pick(cells, ["a", "b"], ("last_number",))["cold"]
    assert list(cold) == ["a"] and "a cold start in skill" in cold["a"] and "probe-hints" in cold["a"]
    warmer = pick([_cell("a", 0.0, 0.0), _cell("a", 0.05, 0.0, "worked")], ["a"], ("last_number",))["cold"]
    assert "under 10% either way" in warmer["a"]
    at_one_in_48 = pick([_cell("a", 1 / 48, 0.0), _cell("a", 0.67, 0.0, "worked")], ["a"], ("last_number",))["cold"]
    assert "cold by its instruction" in at_one_in_48["a"]  # any picked policy under the room is told apart


def test_the_pick_warns_when_half_a_picked_policys_passes_come_from_cut_off_text():
    cells = [_cell("a", 0.3, 0.9), _cell("b", 0.4, 0.2)]
    note = pick(cells, ["a", "b"], ("last_number",), 48)["note"]
    assert "90% of a's passes were read from completions cut off at 48 tokens" in note
    assert "b's passes" not in note and "--max-new-tokens" in note
    assert "cut off" not in pick([_cell("a", 0.3, 0.49), _cell("b", 0.4, 0.0)], ["a", "b"], ("last_number",))["note"]


def test_the_table_shows_the_cut_offs_and_reads_results_written_before_them():
    cells = [_cell("a", 0.3, 0.9)]
    result = {"cells": [c.__dict__ for c in cells], "pick": pick(cells, ["a"], ("last_number",))}
    table = render(result)
    assert "cut off (of passes)" in table and "| 80% (90%) |" in table and "| chat | last_number | task |" in table
    result["cells"].append(_cell("a", 0.5, 0.0, "worked").__dict__)
    assert "| chat | last_number | worked, T 0.7 | 50.0% |" in render(result)
    del result["cells"][0]["cut_off"], result["cells"][0]["passes_cut_off"], result["cells"][0]["instruction"]
    assert "| chat | last_number | task | 30.0% | 30.0% | 0.90 | 0% (0%) |" in render(result)  # an older result


def test_probe_runs_a_model_from_a_path_and_counts_what_the_token_limit_ended(tmp_path, arithmetic_task):
    """End to end on a tiny built model saved as a pretrained one: every (format, style) cell is measured, and an
    untrained model given 2 new tokens is cut off on nearly every completion (it emits EOS only by chance)."""
    from mutualrl.config import parse_config
    from mutualrl.models.families import ModelShape
    from mutualrl.models.policy import load_policy

    arts = load_policy(family="llama", shape=ModelShape(32, 1, 4, 64, 64), tokenizer_kind="char",
                       corpus=arithmetic_task.corpus, corpus_fingerprint=arithmetic_task.fingerprint(), seed=1)
    arts.model.save_pretrained(tmp_path / "m")
    arts.tokenizer.save_pretrained(tmp_path / "m")
    cfg = parse_config(f"""
name: t
policies:
  - name: tiny
    model: {{path: {tmp_path / 'm'}}}
task: {{name: arithmetic, min_digits: 1, max_digits: 2, train_size: 64, eval_size: 16, answer_format: last_number}}
""", "t")
    result = probe(cfg, n=8, formats=("last_number", "boxed"), max_new_tokens=2, cache=tmp_path / "cache",
                   worked=True, worked_temperature=0.5)
    cells = result["cells"]
    assert [(c["answer_format"], c["style"], c["instruction"], c["temperature"]) for c in cells] == [
        ("last_number", "completion", "task", 1.0), ("last_number", "completion", "worked", 0.5),
        ("boxed", "completion", "task", 1.0), ("boxed", "completion", "worked", 0.5)]
    for c in cells:
        assert c["problems"] == 8 and 0.0 <= c["greedy"] <= 1.0 and 0.0 <= c["sampled"] <= 1.0
        assert c["cut_off"] >= 0.5 and 0.0 <= c["passes_cut_off"] <= 1.0
    assert result["max_new_tokens"] == 2 and result["pick"]["answer_format"] in ("last_number", "boxed")
    assert "cut off (of passes)" in render(result) and "worked, T 0.5" in render(result)


def test_an_evaluation_log_line_marks_each_problem_the_token_limit_cut_off(arithmetic_task):
    """greedy_eval on a tiny untrained model with 2 new tokens: each problem's cut-off bit is its sample's
    finish reason, and the log line keeps it beside the problem's score."""
    import torch

    from mutualrl.models.families import ModelShape
    from mutualrl.models.generation import sample
    from mutualrl.models.policy import encode_prompt, load_policy
    from mutualrl.runtime.evaluation import greedy_eval
    from mutualrl.tasks.verifiers import answer_verifier

    torch.manual_seed(0)
    arts = load_policy(family="llama", shape=ModelShape(32, 1, 4, 64, 64), tokenizer_kind="char",
                       corpus=arithmetic_task.corpus, corpus_fingerprint=arithmetic_task.fingerprint(), seed=1)
    tok, problems = arts.tokenizer, arithmetic_task.eval[:6]
    res = greedy_eval(arts.model, tok, problems, answer_verifier("last_number"), 2)
    direct = sample(arts.model, [encode_prompt(tok, p.prompt, None) for p in problems], eos_id=tok.eos_token_id,
                    pad_id=tok.pad_token_id, max_new_tokens=2, temperature=0)
    assert res.cut_off == [s.finish_reason == "length" for s in direct]
    line = res.record(3, problems)
    assert line["cut_off"] == "".join("1" if s.finish_reason == "length" else "0" for s in direct)
    assert len(line["cut_off"]) == len(line["correct"]) == 6
