"""Answer extraction and pretrained defaults (docs/algorithms.md §5.3): an instruct model's
chat-style answer scores by what it says, a built model keeps whole-completion matching."""

import pytest

from mutualrl.config.schema import (
    LARGE_MODEL_PARAMS,
    LARGE_PRETRAINED_LR,
    PRETRAINED_LR,
    ExperimentConfig,
    pretrained_lr,
)
from mutualrl.models.precision import resolve_precision
from mutualrl.runtime.policy_setup import task_instruction
from mutualrl.tasks import Problem, build_task, build_verifier
from mutualrl.tasks.answers import INSTRUCTIONS, extract_answer


@pytest.mark.parametrize("text, fmt, want", [
    ("The answer is 19.", "last_number", "19"),
    ("4 - 1 = 3", "last_number", "3"),
    ("5 - 9 = -4", "last_number", "-4"),
    ("that is 1,234.50 in all", "last_number", "1234.5"),
    ("19.0", "last_number", "19"),
    ("no number here", "last_number", None),
    ("so \\boxed{\\frac{1}{2}} and done", "boxed", "\\frac{1}{2}"),
    ("\\boxed{1} then \\boxed{2}", "boxed", "2"),
    ("\\boxed{unclosed", "boxed", None),
    ("think <answer>7</answer> more <answer> 8 </answer>", "answer_tags", "8"),
    ("no tags", "answer_tags", None),
    ("work\n\n  42  \n", "last_line", "42"),
    ("  42 ", "whole", "42"),
])
def test_extract_answer(text, fmt, want):
    assert extract_answer(text, fmt) == want


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="unknown answer format"):
        extract_answer("1", "first_number")


def test_chat_style_answer_scores_one_under_last_number_and_zero_whole():
    task = build_task("arithmetic", train_size=10, eval_size=2)
    p = Problem("12+7=", "19")
    chat = build_verifier("default", task, "last_number")
    assert chat.score(p, "The answer is 19.") == 1.0
    assert chat.score(p, "12 + 7 = 19") == 1.0
    assert chat.score(p, "It is 19, no, 20") == 0.0  # the last number is the answer
    assert chat.score(p, "I don't know") == 0.0
    whole = build_verifier("default", task)
    assert whole.score(p, "The answer is 19.") == 0.0 and whole.score(p, "19") == 1.0


def _cfg(*policies, **task):
    return ExperimentConfig(name="x", policies=list(policies), task=task or {})


BUILT = {"name": "tiny", "model": {"family": "llama"}, "tokenizer": {"kind": "char"}}
REAL = {"name": "real", "model": {"path": "/models/some-instruct"}}


def test_a_loaded_model_gets_pretrained_defaults():
    cfg = _cfg(REAL)
    p = cfg.policies[0]
    assert p.warm_start.enabled is False and p.optim.lr is None  # chosen by the model's size when it is loaded
    assert resolve_precision(p.model.dtype, pretrained=True, device=p.engine.device,
                             cpuinfo="flags\t: fpu avx2").name == "float32"  # a CPU without bf16
    assert cfg.task.answer_format == "last_number"
    assert task_instruction(cfg) == INSTRUCTIONS["last_number"]
    # the resolved config round-trips (config.yaml is written resolved)
    again = ExperimentConfig.model_validate(cfg.model_dump())
    assert again.policies[0].optim.lr is None and again.task.answer_format == "last_number"


def test_a_loaded_models_learning_rate_shrinks_with_its_size():
    """AdamW's first step moves every parameter by ~lr, so the objective moves by ~lr·‖g‖₁, which grows with the
    parameter count: SmolLM2-135M and Gemma-3-270M keep 1e-5, the 630 M Qwen2.5-Coder gets 1e-6."""
    assert pretrained_lr(135_000_000) == pretrained_lr(268_000_000) == PRETRAINED_LR == 1e-5
    assert pretrained_lr(LARGE_MODEL_PARAMS) == PRETRAINED_LR
    assert pretrained_lr(LARGE_MODEL_PARAMS + 1) == pretrained_lr(630_000_000) == LARGE_PRETRAINED_LR == 1e-6


def test_values_a_file_sets_are_kept_for_a_loaded_model():
    cfg = _cfg({**REAL, "optim": {"lr": 3e-6}, "warm_start": {"enabled": True}}, answer_format="boxed", instruction="")
    p = cfg.policies[0]
    assert p.optim.lr == 3e-6 and p.warm_start.enabled is True
    assert cfg.task.answer_format == "boxed" and task_instruction(cfg) == ""


def test_a_built_model_keeps_todays_behaviour():
    cfg = _cfg(BUILT)
    p = cfg.policies[0]
    assert p.warm_start.enabled is True and p.optim.lr == 1e-4
    assert resolve_precision(p.model.dtype, pretrained=False, device="cpu",
                             cpuinfo="flags\t: avx512_bf16").name == "float32"
    assert cfg.task.answer_format == "whole" and task_instruction(cfg) == ""
    # beside a pretrained peer the whole experiment asks for the chat format
    assert _cfg(BUILT, REAL).task.answer_format == "last_number"


def test_reasoning_gym_task_config_is_checked():
    with pytest.raises(ValueError, match="needs task.dataset"):
        _cfg(BUILT, name="reasoning_gym")
    with pytest.raises(ValueError, match="are for task reasoning_gym"):
        _cfg(BUILT, name="arithmetic", dataset="products")
    # read from the data when the task is built (tests/unit/test_prompt_forms.py), not from a list of names
    assert _cfg(REAL, name="reasoning_gym", dataset="spell_backward").task.answer_format is None


def test_the_configs_formats_per_task_are_the_tasks_own():
    from mutualrl.config.schema import PRETRAINED_FORMATS
    from mutualrl.tasks.registry import TASKS

    for name, fmt in PRETRAINED_FORMATS.items():
        assert TASKS[name].answer_format == fmt, name


def test_prompt_style_puts_the_instruction_after_the_task_in_the_user_turn(tokenizers):
    from mutualrl.models.policy import PromptStyle, encode_prompt

    tok = tokenizers["bpe"]
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    try:
        style = PromptStyle(instruction="Answer with a number.")
        want = tok.apply_chat_template([{"role": "user", "content": "1+2=\n\nAnswer with a number."}],
                                       add_generation_prompt=True, tokenize=True)
        want = list(want["input_ids"] if hasattr(want, "keys") else want)
        assert encode_prompt(tok, "1+2=", style) == want
        # without the template (or turned off), the bare text: what built models are trained on
        assert encode_prompt(tok, "1+2=", PromptStyle(chat_template=False, instruction="x")) == tok("1+2=")["input_ids"]
    finally:
        tok.chat_template = None


def test_import_gguf_refuses_bad_files_in_one_line(tmp_path):
    import subprocess
    import sys

    cli = [sys.executable, "-m", "mutualrl.app.cli", "models", "import-gguf"]
    missing = subprocess.run([*cli, str(tmp_path / "none.gguf"), "--cache", str(tmp_path)], capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    wrong = subprocess.run([*cli, str(tmp_path / "weights.bin"), "--cache", str(tmp_path)], capture_output=True,
                           text=True, timeout=120)
    assert wrong.returncode == 2 and "is not a .gguf file" in wrong.stderr


def test_a_policy_can_have_its_own_instruction():
    """policies[].prompt.instruction replaces the task's for that policy alone (a peer asked to show its work, a
    receiver left with the sentence it answers best under); the answer format, and so re-verification, stays
    shared. `mutualrl probe` measures each policy under the instruction it will train with."""
    from mutualrl.app.probe import _style
    from mutualrl.runtime.policy_setup import policy_instruction, prompt_style

    own = "Show each partial product, then give the final answer as a number at the end."
    cfg = _cfg({**REAL, "name": "peer", "prompt": {"instruction": own}},
               {**REAL, "name": "receiver"}, {**REAL, "name": "silent", "prompt": {"instruction": ""}})
    peer, receiver, silent = cfg.policies
    assert cfg.task.answer_format == "last_number"  # one format for all three
    assert policy_instruction(cfg, peer) == own
    assert policy_instruction(cfg, receiver) == task_instruction(cfg) == INSTRUCTIONS["last_number"]
    assert policy_instruction(cfg, silent) == ""
    assert prompt_style(cfg, peer).messages("3 * 4 =") == [{"role": "user", "content": f"3 * 4 =\n\n{own}"}]
    assert prompt_style(cfg, receiver).messages("3 * 4 =")[0]["content"].endswith(INSTRUCTIONS["last_number"])
    assert prompt_style(cfg, silent).messages("3 * 4 =") == [{"role": "user", "content": "3 * 4 ="}]
    # the probe tries every format, each with its own sentence, except where a policy fixed its instruction
    assert _style(cfg, 0, "chat", "boxed").instruction == own
    assert _style(cfg, 1, "chat", "boxed").instruction == INSTRUCTIONS["boxed"]
    completion = _style(cfg, 0, "completion", "boxed")
    assert completion.completion_text("3 * 4 =").startswith(f"{own}\n\nQuestion: 3 * 4 =")
    # the task-wide instruction still reaches every policy without one of its own
    both = _cfg({**REAL, "name": "a"}, {**REAL, "name": "b", "prompt": {"instruction": own}}, instruction="Be brief.")
    assert [policy_instruction(both, p) for p in both.policies] == ["Be brief.", own]
