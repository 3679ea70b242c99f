"""`tokenizer.kind: qwen2.5-task`: Qwen2.5's tokenizer trimmed to a task's alphabet segments the
task's text exactly as the whole vocabulary does (docs/algorithms.md §5.2)."""

from __future__ import annotations

import random

import pytest

from mutualrl.models.policy import encode_completion, encode_prompt, load_policy
from mutualrl.models.production import qwen25_task_tokenizer, qwen25_tokenizer, trim_to_alphabet
from mutualrl.tasks.arithmetic import ArithmeticTask


@pytest.fixture(scope="module")
def full():
    return qwen25_tokenizer()


def _texts(alphabet: str, n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))) for _ in range(n)]


@pytest.mark.parametrize("alphabet", ["0123456789+=", "0123456789+-*= ()", "abc xyz,.!?\n"])
def test_text_over_the_alphabet_is_segmented_as_by_the_whole_vocabulary(full, alphabet):
    trimmed = trim_to_alphabet(full, alphabet)
    assert len(trimmed) < len(full) // 20
    for text in _texts(alphabet, 400):
        assert trimmed.tokenize(text) == full.tokenize(text), repr(text)


def test_other_text_round_trips_through_the_byte_tokens(full):
    trimmed = trim_to_alphabet(full, "0123456789+=")
    for text in ["héllo 世界 + 123", "12 + 34 = 46\n", "emoji 🙂!"]:
        ids = trimmed(text, add_special_tokens=False)["input_ids"]
        assert trimmed.decode(ids) == text
        assert len(ids) >= len(full(text, add_special_tokens=False)["input_ids"])  # finer, never coarser


def test_arithmetic_keeps_a_few_hundred_tokens_and_the_policy_specials(full):
    trimmed = trim_to_alphabet(full, "0123456789+=")
    vocab = trimmed.get_vocab()
    assert 256 < len(trimmed) < 300  # 256 bytes, runs of '+' and '=' in Qwen's ranks, 3 specials
    assert trimmed.eos_token == full.eos_token == "<|im_end|>" and trimmed.pad_token == full.pad_token
    assert {"<|endoftext|>", "<|im_start|>", "<|im_end|>"} <= set(vocab)
    assert sorted(vocab.values()) == list(range(len(vocab)))  # dense ids
    assert "<|extra_0|>" not in vocab


def test_a_policy_on_the_trimmed_vocabulary(tmp_path):
    """The config kind builds a model whose embedding is the trimmed size; prompt and completion
    round-trip, and the cache entry is keyed by the alphabet (a second task gets its own)."""
    task = ArithmeticTask(min_digits=3, max_digits=3, operators="+")
    arts = load_policy(family="qwen2", tokenizer_kind="qwen2.5-task", corpus=task.corpus,
                       corpus_fingerprint=task.fingerprint(), cache_dir=tmp_path)
    tok = arts.tokenizer
    assert arts.model.get_input_embeddings().num_embeddings == len(tok) < 300
    ids = encode_prompt(tok, "123+456=", False) + encode_completion(tok, "579")
    assert tok.convert_ids_to_tokens(ids) == ["1", "2", "3", "+", "4", "5", "6", "=", "5", "7", "9", "<|im_end|>"]
    assert tok.decode(ids, skip_special_tokens=True) == "123+456=579"
    other = qwen25_task_tokenizer("0123456789*=", tmp_path)
    assert len(list(tmp_path.glob("tokenizers/qwen2.5-task-*"))) == 2 and "*" in other.get_vocab()
    with pytest.raises(ValueError, match="empty alphabet"):
        qwen25_task_tokenizer("", tmp_path)
