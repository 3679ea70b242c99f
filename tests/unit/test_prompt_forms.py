"""Prompt forms (chat, completion, bare), stop strings that cut a completion's text and tokens alike, answer
formats read from a task's data, and a missing task package caught before a run starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mutualrl.models.generation import Sample, cut_at_stop
from mutualrl.models.policy import COMPLETION_STOPS, PromptStyle, encode_prompt
from mutualrl.tasks.answers import format_from_answers, is_number

ROOT = Path(__file__).resolve().parents[2]
PIECES = {0: "12 + 7 = ", 1: "19", 2: "\nQu", 3: "estion: What", 4: " is"}


def _decode(ids: list[int]) -> str:
    return "".join(PIECES[i] for i in ids)


def test_a_stop_string_ending_mid_token_keeps_that_token_and_cuts_the_text_before_the_stop():
    s = Sample([0, 1, 2, 3, 4], [-0.1, -0.2, -0.3, -0.4, -0.5], "length")
    cut, text = cut_at_stop(_decode, s, ("\nQ",))  # "\nQ" ends inside "\nQu"
    assert cut.token_ids == [0, 1, 2] and cut.logprobs == [-0.1, -0.2, -0.3] and cut.finish_reason == "stop"
    assert text == "12 + 7 = 19"
    cut, text = cut_at_stop(_decode, s, ("\nQuestion:",))  # ends inside "estion: What": that token is kept whole
    assert cut.token_ids == [0, 1, 2, 3] and cut.logprobs == s.logprobs[:4] and text == "12 + 7 = 19"


def test_the_first_stop_string_in_the_text_wins_and_no_stop_leaves_the_sample_alone():
    s = Sample([0, 1, 2, 3, 4], [-0.1] * 5, "length")
    _, text = cut_at_stop(_decode, s, ("What", " = "))
    assert text == "12 + 7"  # " = " comes first in the text, though listed second
    same, text = cut_at_stop(_decode, s, ("Answer:",))
    assert same is s and text == _decode(s.token_ids)


def test_the_three_prompt_forms(tokenizers, tmp_path):
    tok = tokenizers["bpe"]  # no chat template
    bare = PromptStyle(instruction="Be brief.")
    completion = PromptStyle(instruction="Be brief.", completion_template="{instruction}Question: {prompt}\nAnswer:")
    assert bare.form(tok) == "bare" and completion.form(tok) == "completion"
    assert encode_prompt(tok, "1+2", bare) == tok("1+2", add_special_tokens=True)["input_ids"]
    want = "Be brief.\n\nQuestion: 1+2\nAnswer:"
    assert completion.completion_text("1+2") == want
    assert encode_prompt(tok, "1+2", completion) == tok(want, add_special_tokens=True)["input_ids"]
    assert completion.stops(tok) == COMPLETION_STOPS and bare.stops(tok) == ()
    assert PromptStyle(completion_template="{prompt}=", stop=("\n",)).stops(tok) == ("\n",)
    assert PromptStyle(completion_template="Q: {prompt}").completion_text("x") == "Q: x"  # no instruction: no block


def test_config_prompt_styles_per_policy():
    from mutualrl.config.schema import ExperimentConfig
    from mutualrl.runtime.policy_setup import prompt_style

    cfg = ExperimentConfig.model_validate({
        "name": "t", "task": {"name": "arithmetic", "answer_format": "last_number"},
        "policies": [{"name": "built", "model": {"family": "llama"}, "tokenizer": {"kind": "char"}},
                     {"name": "base", "model": {"path": "/nonexistent"}},
                     {"name": "forced", "model": {"path": "/nonexistent"},
                      "prompt": {"style": "completion", "template": "Q: {prompt}\nA:", "stop": ["\nQ:"]}}]})
    built, base, forced = (prompt_style(cfg, p) for p in cfg.policies)
    assert built.completion_template is None  # a built model sees the bare task text
    assert base.completion_template and base.chat_template is None and base.stop is None
    assert forced.chat_template is False and forced.completion_template == "Q: {prompt}\nA:" and forced.stop == (
        "\nQ:",)
    with pytest.raises(ValueError, match=r"prompt.template needs \{prompt\}"):
        ExperimentConfig.model_validate({"name": "t", "policies": [{"name": "a", "model": {"path": "/x"},
                                                       "prompt": {"template": "Answer:"}}]})


def test_answer_format_comes_from_the_data():
    assert is_number("-3") and is_number("1,024") and is_number("0.5") and not is_number("3 apples")
    assert format_from_answers(["12", "-4", "7.5"]) == "last_number"
    assert format_from_answers(["12", "cat"]) == "answer_tags" and format_from_answers([]) == "answer_tags"


def test_a_numeric_reasoning_gym_dataset_outside_any_list_gets_last_number():
    pytest.importorskip("reasoning_gym")
    from mutualrl.config.schema import ExperimentConfig
    from mutualrl.runtime.policy_setup import build_task_from_config

    # count_primes answers with a number; nothing in the code names it
    cfg = ExperimentConfig.model_validate({
        "name": "t", "task": {"name": "reasoning_gym", "dataset": "count_primes", "train_size": 80, "eval_size": 8},
        "policies": [{"name": "p", "model": {"path": "/nonexistent"}}]})
    assert cfg.task.answer_format is None  # resolved from the data when the task is built
    build_task_from_config(cfg)
    assert cfg.task.answer_format == "last_number"
    words = ExperimentConfig.model_validate({
        "name": "t", "task": {"name": "reasoning_gym", "dataset": "spell_backward", "train_size": 80, "eval_size": 8},
        "policies": [{"name": "p", "model": {"path": "/nonexistent"}}]})
    build_task_from_config(words)
    assert words.task.answer_format == "answer_tags"


def test_a_missing_task_package_is_one_line_before_anything_starts(tmp_path):
    """validate and run name the package and the command, exit 2, no traceback (reasoning-gym hidden from the
    child interpreter, as if it were not installed)."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "sitecustomize.py").write_text("import sys\nsys.modules['reasoning_gym'] = None  # not installed\n")
    cfg = ROOT / "examples" / "real" / "smollm2.yaml"
    env = {"PYTHONPATH": str(shadow), "PATH": "/usr/bin:/bin"}
    for cmd in (["validate", str(cfg)], ["run", str(cfg), "--out", str(tmp_path / "run")]):
        p = subprocess.run([sys.executable, "-m", "mutualrl.app.cli", *cmd], capture_output=True, text=True,
                           timeout=300, env=env)
        assert p.returncode == 2, (cmd, p.stdout, p.stderr[-2000:])
        assert "Traceback" not in p.stderr and "reasoning-gym" in p.stderr and "pip install" in p.stderr
        assert not (tmp_path / "run").exists()
