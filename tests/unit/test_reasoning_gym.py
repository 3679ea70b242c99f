"""reasoning-gym datasets as tasks: seeded held-out splits, and each dataset's own scorer reached
through our verifier path (config -> task -> verifier), for an arithmetic, a search and a word task."""

import pytest

pytest.importorskip("reasoning_gym", reason="the real extra (pip install '.[real]'; make test installs it)")

from mutualrl.config import ConfigError  # noqa: E402
from mutualrl.config.schema import ExperimentConfig  # noqa: E402
from mutualrl.runtime.policy_setup import build_task_from_config  # noqa: E402

REAL = {"name": "real", "model": {"path": "/models/some-instruct"}}
EASY_SUMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ["+", "-"],
             "allow_parentheses": False, "allow_negation": False}


def _task(dataset, settings=None, policy=REAL, **task):
    cfg = ExperimentConfig(name="x", policies=[policy],
                           task={"name": "reasoning_gym", "dataset": dataset, "dataset_config": settings or {},
                                 "train_size": 200, "eval_size": 20, **task})
    return build_task_from_config(cfg)


def test_basic_arithmetic_chat_answer_scores_by_the_datasets_scorer():
    task, verifier = _task("basic_arithmetic", EASY_SUMS)
    p = task.eval[0]
    assert p.prompt.startswith("Calculate") and verifier.answer_format == "last_number"
    assert verifier.score(p, f"{p.prompt.removeprefix('Calculate ').rstrip('.')} = {p.answer}") == 1.0
    assert verifier.score(p, f"The answer is {p.answer}.") == 1.0
    assert verifier.score(p, f"The answer is {int(p.answer) + 1}.") == 0.0
    assert verifier.score(p, "I cannot say") == 0.0


def test_countdown_search_task_scores_any_valid_expression_in_answer_tags():
    task, verifier = _task("countdown", {"min_numbers": 3, "max_numbers": 3, "min_target": 10, "max_target": 50})
    assert verifier.answer_format == "answer_tags"
    p = task.train[0]
    assert verifier.score(p, f"Let me try. <answer>{p.answer}</answer>") == 1.0
    # a well-formed wrong expression gets partial credit (0.05) from the scorer: not a success
    nums = p.meta["entry"]["metadata"]["numbers"]
    assert verifier.score(p, f"<answer>{nums[0]}</answer>") == 0.0
    assert verifier.score(p, p.answer) == 0.0  # no tags: no answer


def test_word_task_spell_backward():
    task, verifier = _task("spell_backward")
    p = task.eval[3]
    assert verifier.score(p, f"Reversed: <answer>{p.answer}</answer>") == 1.0
    assert verifier.score(p, f"<answer>{p.answer[::-1]}x</answer>") == 0.0


def test_splits_are_seeded_held_out_and_built_models_match_the_whole_completion():
    built = {"name": "tiny", "model": {"family": "llama"}, "tokenizer": {"kind": "char"}}
    a, verifier = _task("basic_arithmetic", EASY_SUMS, policy=built)
    b, _ = _task("basic_arithmetic", EASY_SUMS, policy=built)
    assert [p.prompt for p in a.train] == [p.prompt for p in b.train] and a.fingerprint() == b.fingerprint()
    assert not {p.prompt for p in a.train} & {p.prompt for p in a.eval}
    assert verifier.answer_format == "whole"
    p = a.eval[0]
    assert verifier.score(p, p.answer) == 1.0 and verifier.score(p, f"It is {p.answer}") == 0.0


def test_unknown_dataset_and_bad_settings_are_clear_errors():
    with pytest.raises(ConfigError, match="unknown reasoning-gym dataset 'basic_arithmetix'"):
        _task("basic_arithmetix")
    with pytest.raises(ConfigError, match="rejects settings"):
        _task("basic_arithmetic", {"no_such_setting": 1})
