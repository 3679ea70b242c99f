"""Tokenizers of different algorithms trained on a task corpus with the `tokenizers` library.

Different algorithms give policies genuinely different vocabularies and token
boundaries, which is what THL has to bridge: char-level (WordLevel over single
characters), byte-level BPE (GPT-2 style; ``bpe-digits`` splits digits as Qwen2.5 does), Unigram (SentencePiece style,
Metaspace pre-tokenisation, byte fallback) and WordPiece (BERT style).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]


def _char(corpus: list[str], vocab_size: int) -> Tokenizer:
    chars = sorted({c for text in corpus for c in text})
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return tok


def _byte_level_bpe(corpus: list[str], vocab_size: int, pre_tokenizer) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def _bpe(corpus: list[str], vocab_size: int) -> Tokenizer:
    return _byte_level_bpe(corpus, vocab_size, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))


def _bpe_digits(corpus: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE whose pre-tokenizer isolates every digit, as Qwen2.5's does (``\\p{N}``
    one at a time): merges never span digits, so a number is its digits — the segmentation
    production vocabularies chose for arithmetic — while the rest of the text merges as BPE."""
    digits = pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated")
    return _byte_level_bpe(corpus, vocab_size,
                           pre_tokenizers.Sequence([digits,
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))


def _unigram(corpus: list[str], vocab_size: int) -> Tokenizer:
    """SentencePiece-style Unigram with byte fallback: a character outside the vocabulary
    becomes its UTF-8 bytes as ``<0xNN>`` pieces (as in Llama 2 / Gemma vocabularies)
    instead of ``<unk>``, so any text round-trips."""
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        unk_token=UNK,
        initial_alphabet=sorted({c for t in corpus for c in t}),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    trained = json.loads(tok.to_str())["model"]
    pieces = [(p, s) for p, s in trained["vocab"]]
    floor = min(s for _, s in pieces if s < 0) - 10.0  # byte pieces only when nothing else fits
    known = {p for p, _ in pieces}
    pieces += [(f"<0x{b:02X}>", floor) for b in range(256) if f"<0x{b:02X}>" not in known]
    out = Tokenizer(models.Unigram(pieces, unk_id=trained["unk_id"], byte_fallback=True))
    out.normalizer = tok.normalizer
    out.pre_tokenizer = tok.pre_tokenizer
    out.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Metaspace(replacement="▁", prepend_scheme="never")])
    out.add_special_tokens(SPECIALS)
    return out


def _wordpiece(corpus: list[str], vocab_size: int) -> Tokenizer:
    """BERT-style WordPiece: words split on whitespace and punctuation, continuation pieces
    prefixed ``##``. Decoding re-inserts a space between words, so whitespace is not
    preserved exactly (``12+34`` decodes as ``12 + 34``) — THL reports that as a failed
    round trip instead of aligning it silently."""
    tok = Tokenizer(models.WordPiece(unk_token=UNK))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=sorted({c for t in corpus for c in t if not c.isspace()}),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


TOKENIZER_KINDS: dict[str, Callable[[list[str], int], Tokenizer]] = {
    "char": _char,
    "bpe": _bpe,
    "bpe-digits": _bpe_digits,
    "unigram": _unigram,
    "wordpiece": _wordpiece,
}

BUILDER_VERSIONS: dict[str, int] = {"unigram": 2}
"""Bumped when a kind's builder changes its output, so cached tokenizers of that kind are rebuilt."""


def build_tokenizer(kind: str, corpus: Iterable[str], vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """Train a tokenizer of ``kind`` on ``corpus`` and wrap it for transformers.

    Prompts get ``<bos>`` prepended by the post-processor (``add_special_tokens=True``);
    completions are encoded without specials and end with ``<eos>`` appended by
    the caller, which mirrors how real chat models are fed.
    """
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"unknown tokenizer kind {kind!r}; valid: {', '.join(sorted(TOKENIZER_KINDS))}")
    texts = list(corpus)
    if not texts:
        raise ValueError("cannot train a tokenizer on an empty corpus")
    raw = TOKENIZER_KINDS[kind](texts, vocab_size)
    bos_id = raw.token_to_id(BOS)
    raw.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A $B",
                                                       special_tokens=[(BOS, bos_id)])
    return PreTrainedTokenizerFast(
        tokenizer_object=raw,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load any Hugging Face tokenizer from a local directory (or a hub name when online).

    A tokenizer without a pad token gets its EOS as pad, which is what batched
    left-padded generation needs; one without EOS cannot end completions and is
    rejected.
    """
    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.eos_token_id is None:
        raise ValueError(f"tokenizer at {path} has no EOS token; completions could never end")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok
