"""THL: conversion between tokenizers of different algorithms, exact log-prob transport, residuals."""

import pytest

from mutualrl.models import build_tokenizer
from mutualrl.thl import ThlBudget, align_spans, convert, token_byte_spans, transport_logprobs

PAIRS = [("char", "bpe"), ("bpe", "char"), ("bpe", "unigram"), ("unigram", "char"), ("char", "unigram"),
         ("unigram", "bpe"),
         ("bpe", "bpe-digits"), ("bpe-digits", "unigram")]


def test_bpe_digits_never_merges_across_digits():
    """Qwen2.5's rule: every digit is its own token; other text still merges as BPE."""
    tok = build_tokenizer("bpe-digits", ["the sum 123+456=579 is fine"] * 50, 300)
    pieces = tok.convert_ids_to_tokens(tok("the sum 905+16=921", add_special_tokens=False)["input_ids"])
    digits = [p for p in pieces if any(ch.isdigit() for ch in p)]
    assert digits == list("90516921")
    assert any(len(p) > 1 for p in pieces)  # the words merged
    assert tok.decode(tok("905+16=921 ok", add_special_tokens=False)["input_ids"]) == "905+16=921 ok"


@pytest.mark.parametrize("src,tgt", PAIRS)
@pytest.mark.parametrize("text", ["46", "100", "12+34=46"])
def test_exact_conversion_preserves_text_and_logprob_sum(tokenizers, src, tgt, text):
    s, t = tokenizers[src], tokenizers[tgt]
    ids = s(text, add_special_tokens=False)["input_ids"] + [s.eos_token_id]
    lps = [-0.1 * (i + 1) for i in range(len(ids))]
    c = convert(s, t, source_ids=ids, source_logprobs=lps)
    assert c.text == text
    assert t.decode(c.target_ids, skip_special_tokens=True) == text
    assert c.residual.roundtrip_ok and c.residual.unaligned_fraction == 0.0
    # EOS is excluded from the probability contract (docs/algorithms.md §2.10)
    assert sum(c.target_logprobs) == pytest.approx(sum(lps[:-1]), abs=1e-9)
    assert c.residual.logprob_residual == pytest.approx(0.0, abs=1e-9)
    assert all(c.target_mask)
    # groups partition the bytes and cover every token once
    assert c.groups[0].start == 0 and c.groups[-1].end == len(text.encode())
    assert all(a.end == b.start for a, b in zip(c.groups, c.groups[1:]))
    assert sorted(i for g in c.groups for i in g.target) == list(range(len(c.target_ids)))


def test_many_to_many_groups_hand_checked():
    # source tokens "12" "+3" ; target tokens "1" "2+" "3": boundaries coincide only at 3 bytes (end)
    src = [(0, 2), (2, 4)]
    tgt = [(0, 1), (1, 3), (3, 4)]
    groups = align_spans(src, tgt)
    assert [(g.source, g.target, g.start, g.end) for g in groups] == [((0, 1), (0, 1, 2), 0, 4)]
    lps, mask = transport_logprobs(groups, [True], [-1.0, -2.0], 3, "spread")
    assert lps == pytest.approx([-1.0, -1.0, -1.0]) and mask == [1, 1, 1]
    lps, _ = transport_logprobs(groups, [True], [-1.0, -2.0], 3, "last")
    assert lps == pytest.approx([0.0, 0.0, -3.0])


def test_unrepresentable_text_is_reported_and_over_budget(tokenizers):
    c = convert(None, tokenizers["char"], text="12ü3")  # 'ü' is not in the char vocabulary
    assert not c.residual.roundtrip_ok
    assert c.residual.unaligned_fraction > 0
    assert ThlBudget().rejection(c.residual) == "roundtrip"
    assert ThlBudget(require_roundtrip=False).rejection(c.residual) == "unaligned"


def test_non_canonical_source_path_is_flagged(tokenizers):
    bpe = tokenizers["bpe"]
    # a merged two-character token, e.g. '+3' or '=4': sampling its characters one by one is a
    # valid but non-canonical path to the same text
    merged = next(t for t, i in sorted(bpe.get_vocab().items(),
                                       key=lambda kv: kv[1]) if len(t) == 2 and all(c in "0123456789+=" for c in t))
    split = [bpe.convert_tokens_to_ids(merged[0]), bpe.convert_tokens_to_ids(merged[1])]
    c = convert(bpe, tokenizers["char"], source_ids=split, source_logprobs=[-1.0, -1.0])
    assert c.residual.non_canonical and c.text == merged
    assert c.residual.unaligned_fraction == 0 and sum(c.target_logprobs) == pytest.approx(-2.0)


def test_multibyte_character_split_by_byte_level_tokens():
    tok = build_tokenizer("bpe", ["ab"] * 10, 270)  # no merges involving 'é', so it is two byte tokens
    ids = tok("é", add_special_tokens=False)["input_ids"]
    assert len(ids) == 2
    text, spans = token_byte_spans(tok, ids)
    # byte-level: each byte token owns its byte, though the first ends mid-character
    assert text == "é" and spans == [(0, 1), (1, 2)]
    c = convert(tok, tok, source_ids=ids, source_logprobs=[-0.5, -0.25])
    assert c.residual.unaligned_fraction == 0 and sum(c.target_logprobs) == pytest.approx(-0.75)
    # into a char vocabulary: both byte tokens form one group with the single 'é' token
    char = build_tokenizer("char", ["é ab"] * 10)
    c = convert(tok, char, source_ids=ids, source_logprobs=[-0.5, -0.25])
    assert [g.to_dict() for g in c.groups] == [{"source": [0, 1], "target": [0], "bytes": [0, 2]}]
    assert c.target_logprobs == pytest.approx([-0.75])


def test_bad_input_is_an_error(tokenizers):
    t = tokenizers["char"]
    with pytest.raises(ValueError, match="must match"):
        convert(t, t, source_ids=[5, 6], source_logprobs=[-1.0])
    with pytest.raises(ValueError, match="needs source_ids or text"):
        convert(t, t)
    empty = convert(t, tokenizers["bpe"], source_ids=[t.eos_token_id], source_logprobs=[-1.0])
    assert empty.text == "" and empty.target_ids == []


def test_unigram_byte_fallback_pieces_group_with_their_character():
    uni = build_tokenizer("unigram", ["ab cd"] * 20, 40)  # no CJK in the corpus: 世 and 界 fall back to bytes
    char = build_tokenizer("char", ["世界 ab"] * 10)
    ids = uni("a世界", add_special_tokens=False)["input_ids"]
    pieces = uni.convert_ids_to_tokens(ids)
    assert pieces[1:] == ["<0xE4>", "<0xB8>", "<0x96>", "<0xE7>", "<0x95>", "<0x8C>"]
    lps = [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6, -0.7]
    c = convert(uni, char, source_ids=ids, source_logprobs=lps)
    assert c.text == "a世界" and c.residual.roundtrip_ok and c.residual.unaligned_fraction == 0
    # the three byte pieces of each character form one group with that character's token
    assert [(g.source, g.target) for g in c.groups] == [((0,), (0,)), ((1, 2, 3), (1,)), ((4, 5, 6), (2,))]
    assert c.target_logprobs == pytest.approx([-0.1, -0.9, -1.8])
    from mutualrl.thl import convert_batch

    b = convert_batch(uni, char, [ids], [lps], with_groups=True)[0]
    assert [g.to_dict() for g in b.groups] == [g.to_dict() for g in c.groups]
    assert b.target_logprobs == pytest.approx(c.target_logprobs)


def test_wordpiece_whitespace_loss_is_reported_not_aligned():
    wp = build_tokenizer("wordpiece", ["the quick brown fox 12 + 34"] * 20, 60)
    bpe = build_tokenizer("bpe", ["the quick brown fox 12+34"] * 20, 280)
    # words separated by single spaces survive WordPiece decoding exactly
    src_ids = bpe("the quick fox", add_special_tokens=False)["input_ids"]
    lps = [-0.5 - 0.1 * i for i in range(len(src_ids))]
    ok = convert(bpe, wp, source_ids=src_ids, source_logprobs=lps)
    assert ok.residual.roundtrip_ok and ok.residual.unaligned_fraction == 0
    assert sum(ok.target_logprobs) == pytest.approx(sum(lps), abs=1e-9)
    # '12+34' decodes as '12 + 34' in WordPiece: an explicit residual, and the budget rejects it
    bad = convert(bpe, wp, source_ids=bpe("12+34", add_special_tokens=False)["input_ids"])
    assert not bad.residual.roundtrip_ok and bad.residual.unaligned_fraction > 0
    assert ThlBudget().rejection(bad.residual) == "roundtrip"
