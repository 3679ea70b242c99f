"""Per-vocabulary token → bytes tables for byte-level BPE tokenizers.

In a byte-level BPE vocabulary (GPT-2, Qwen, Llama 3 …) every ordinary token
stands for a fixed byte string, independent of context: decoding is byte
concatenation. So the canonical text of a sequence and every token's byte
span come from one table lookup per token, without calling the decoder or
re-encoding for offsets — which is what lets batched THL cost about as much
as a plain encode. Added and special tokens are marked irregular; rows
containing one take the exact general path.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
from transformers import PreTrainedTokenizerBase


def _byte_to_unicode() -> dict[int, str]:
    """The reversible byte → printable character map of byte-level BPE (GPT-2's scheme):
    printable Latin-1 bytes map to themselves, the other 68 to code points from 256 upward."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    mapping = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


_UNICODE_TO_BYTE = {c: b for b, c in _byte_to_unicode().items()}


@dataclass(frozen=True)
class VocabBytes:
    pieces: list[bytes]  # bytes of each token id (b"" where irregular)
    lengths: np.ndarray  # [V] int64, len(pieces[i])
    regular: np.ndarray  # [V] bool: the token is an ordinary byte-level token

    def join(self, ids: list[int]) -> bytes:
        p = self.pieces
        return b"".join([p[i] for i in ids])


_CACHE: "weakref.WeakKeyDictionary[PreTrainedTokenizerBase, VocabBytes | None]" = weakref.WeakKeyDictionary()


def vocab_bytes(tok: PreTrainedTokenizerBase) -> VocabBytes | None:
    """The table of a fast tokenizer whose decoder is pure ByteLevel; None for any other kind."""
    try:
        return _CACHE[tok]
    except (KeyError, TypeError):
        pass
    table = _build(tok)
    try:
        _CACHE[tok] = table
    except TypeError:
        pass
    return table


def _build(tok: PreTrainedTokenizerBase) -> VocabBytes | None:
    be = getattr(tok, "backend_tokenizer", None) if getattr(tok, "is_fast", False) else None
    if be is None or type(be.decoder).__name__ != "ByteLevel":
        return None
    size = be.get_vocab_size(with_added_tokens=True)
    pieces: list[bytes] = [b""] * size
    regular = np.zeros(size, dtype=bool)
    added = set(tok.added_tokens_decoder)
    for token, idx in be.get_vocab(with_added_tokens=True).items():
        if idx in added or idx >= size:
            continue
        try:
            pieces[idx] = bytes(_UNICODE_TO_BYTE[c] for c in token)
        except KeyError:
            continue  # not a byte-level symbol: treat as irregular
        regular[idx] = True
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=size)
    return VocabBytes(pieces, lengths, regular)


_FALLBACK: "weakref.WeakKeyDictionary[PreTrainedTokenizerBase, np.ndarray]" = weakref.WeakKeyDictionary()


def byte_fallback_mask(tok: PreTrainedTokenizerBase) -> np.ndarray:
    """[V] bool: ids of SentencePiece byte-fallback pieces (``<0xNN>``).

    Fast tokenizers report the offsets of the whole pre-token for each such piece, so
    their offsets cannot place the piece's byte; rows that contain one take the exact path.
    """
    try:
        return _FALLBACK[tok]
    except (KeyError, TypeError):
        pass
    vocab = tok.get_vocab()
    mask = np.zeros(max(vocab.values(), default=-1) + 1, dtype=bool)
    for token, idx in vocab.items():
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            try:
                int(token[3:5], 16)
            except ValueError:
                continue
            mask[idx] = True
    try:
        _FALLBACK[tok] = mask
    except TypeError:
        pass
    return mask


def has_byte_fallback(mask: np.ndarray, ids: list[int]) -> bool:
    if not mask.any() or not ids:
        return False
    arr = np.asarray(ids, dtype=np.int64)
    arr = arr[arr < len(mask)]
    return bool(mask[arr].any())
