"""THL between real vocabularies: SmolLM2-135M-Instruct (49,152 tokens) and Qwen2.5 (151,646, rebuilt
offline) carry 1,000 task and chat texts both ways with no unaligned byte, and the receiver's ids are
exactly its plain encoding of the text; chat-template specials never travel as text."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("reasoning_gym", reason="the real extra (pip install '.[real]')")


def _texts(n: int = 1000) -> list[str]:
    import reasoning_gym as rg

    texts: list[str] = []
    for name in ("basic_arithmetic", "countdown", "spell_backward", "leg_counting", "word_sorting", "products"):
        texts += [e["question"] for e in rg.create_dataset(name, seed=1, size=80)]
    rng = random.Random(0)
    openers = ["To calculate {a} + {b}, we simply add them together. {a} + {b} equals {c}.",
               "Let's solve this step by step:\n\n{a} + {b} = {c}\n\nSo, the result is {c}.",
               "The answer is {c}.", "{a} + {b} = {c}", "<answer>{c}</answer>",
               "Sure! Here’s the sum — {c} (i.e. {a}+{b}).",
               "  leading spaces, tabs\tand a café: {c} €", "Résultat : {c} ✓ 你好 {a}"]
    while len(texts) < n:
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        texts.append(rng.choice(openers).format(a=a, b=b, c=a + b))
    return texts[:n]


@pytest.fixture(scope="module")
def qwen25():
    from mutualrl.models.production import qwen25_tokenizer

    return qwen25_tokenizer()


@pytest.mark.parametrize("direction", ["smollm2->qwen2.5", "qwen2.5->smollm2"])
def test_thousand_task_and_chat_texts_carry_exactly(direction, smollm2_tokenizer, qwen25):
    from mutualrl.thl import convert

    src, dst = (smollm2_tokenizer, qwen25) if direction.startswith("smollm2") else (qwen25, smollm2_tokenizer)
    bad = []
    for text in _texts():
        ids = src(text, add_special_tokens=False)["input_ids"]
        conv = convert(src, dst, source_ids=ids, source_logprobs=[-0.5] * len(ids))
        r = conv.residual
        if (conv.text != text or r.unaligned_fraction != 0.0 or not r.roundtrip_ok or r.logprob_residual > 1e-9
            or conv.target_ids != dst(text, add_special_tokens=False)["input_ids"]):
            bad.append((text, r))
    assert not bad, f"{len(bad)} of 1000 texts were not carried exactly, e.g. {bad[:3]}"


def test_chat_specials_never_travel_as_text(smollm2_tokenizer, qwen25):
    from mutualrl.thl import convert

    tok = smollm2_tokenizer
    body = tok("The answer is 19.", add_special_tokens=False)["input_ids"]
    im_start, im_end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    ids = body + [im_end, im_start] + tok("user", add_special_tokens=False)["input_ids"] + [im_end]
    conv = convert(tok, qwen25, source_ids=ids, source_logprobs=[-0.1] * len(ids))
    assert "<|im_" not in conv.text and conv.text.startswith("The answer is 19.")
    specials = {qwen25.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")}
    assert not specials & set(conv.target_ids)
