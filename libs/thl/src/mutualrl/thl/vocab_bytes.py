"""Per-vocabulary token → bytes tables, for vocabularies whose decoding is concatenation.

In a byte-level BPE vocabulary (GPT-2, Qwen, Llama 3 …) every ordinary token
stands for a fixed byte string, independent of context: decoding is byte
concatenation. The same holds for character vocabularies and for SentencePiece
pieces whose decoder only maps ``▁`` to a space and ``<0xNN>`` to a byte —
which the table builder verifies against the real decoder before trusting it
(a decoder that strips a leading space or inserts spaces, like WordPiece's,
gets no table). With a table, the canonical text of a sequence and every
token's byte span come from one lookup per token, without calling the decoder
or re-encoding for offsets — which is what lets batched THL cost about as much
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
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"),
        ord("ÿ") + 1))
    mapping = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


_UNICODE_TO_BYTE = {c: b for b, c in _byte_to_unicode().items()}
# str.translate table: byte-level symbols -> the code point of their byte (then latin-1 gives the
# bytes); raw characters below 256 that are *not* byte-level symbols -> U+FFFF, which latin-1
# rejects, so such tokens are marked irregular instead of mis-read
_TRANSLATE = {ord(c): b for c, b in _UNICODE_TO_BYTE.items()}
_TRANSLATE.update({cp: 0xFFFF for cp in range(256) if cp not in _TRANSLATE})


@dataclass(frozen=True)
class VocabBytes:
    """The bytes each token of a vocabulary stands for, so tokenisations can be aligned on byte offsets."""
    pieces: list[bytes]  # bytes of each token id (b"" where irregular)
    lengths: np.ndarray  # [V] int64, len(pieces[i])
    regular: np.ndarray  # [V] bool: the token is an ordinary byte-level token

    def join(self, ids: list[int]) -> bytes:
        """The bytes the token ids spell."""
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
    if be is None:
        return None
    byte_level = type(be.decoder).__name__ == "ByteLevel"
    size = be.get_vocab_size(with_added_tokens=True)
    pieces: list[bytes] = [b""] * size
    regular = np.zeros(size, dtype=bool)
    added = set(tok.added_tokens_decoder)
    for token, idx in be.get_vocab(with_added_tokens=True).items():
        if idx in added or idx >= size:
            continue
        try:
            pieces[idx] = _piece_bytes(token, byte_level)
        except UnicodeEncodeError:
            continue  # not a byte-level symbol: treat as irregular
        regular[idx] = True
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=size)
    table = VocabBytes(pieces, lengths, regular)
    return table if byte_level or _agrees_with_decoder(tok, table) else None


def _fallback_byte(token: str) -> int | None:
    """The byte a SentencePiece byte-fallback piece ``<0xNN>`` stands for, else None."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


def _piece_bytes(token: str, byte_level: bool) -> bytes:
    if byte_level:
        return token.translate(_TRANSLATE).encode("latin-1")
    byte = _fallback_byte(token)
    if byte is not None:
        return bytes([byte])
    return token.replace("\u2581", " ").encode("utf-8")  # Metaspace: ▁ stands for a space


def _agrees_with_decoder(tok: PreTrainedTokenizerBase, table: VocabBytes, samples: int = 300) -> bool:
    """Other decoders (Metaspace, Fuse, ByteFallback, …) are context-free for some configurations
    and not for others (a prefix-space strip, WordPiece's inserted spaces). Accept the table
    only if it reproduces the real decoder on random token sequences — including sequences
    that start with a space piece and byte-fallback runs."""
    ids = np.nonzero(table.regular)[0]
    if len(ids) == 0:
        return False
    single = [i for i in ids.tolist() if len(table.pieces[i]) != 1 or table.pieces[i] < b"\x80"]  # not a lone high byte
    rng = np.random.default_rng(0)
    be = tok.backend_tokenizer
    seqs = [rng.choice(single, size=int(rng.integers(1, 16))).tolist() for _ in range(samples)]
    spaced = [i for i in single if table.pieces[i].startswith(b" ")][:50]
    seqs += [[i] + s[:5] for i, s in zip(spaced, seqs)]
    by_byte = {table.pieces[i]: i for i in ids.tolist() if len(table.pieces[i]) == 1}
    for ch in "é世🙂ñ":  # multi-byte characters spelled with byte-fallback pieces, when the vocabulary has them
        run = [by_byte.get(bytes([b])) for b in ch.encode("utf-8")]
        if all(r is not None for r in run):
            seqs.append([single[0], *run, single[-1]])  # type: ignore[list-item]
    decoded = be.decode_batch(seqs, skip_special_tokens=True)
    checked = 0
    for seq, text in zip(seqs, decoded):
        try:
            expect = table.join(seq).decode("utf-8")
        except UnicodeDecodeError:
            continue
        if expect != text:
            return False
        checked += 1
    return checked >= samples // 4


_FALLBACK: "weakref.WeakKeyDictionary[PreTrainedTokenizerBase, np.ndarray]" = weakref.WeakKeyDictionary()


def byte_fallback_mask(tok: PreTrainedTokenizerBase) -> np.ndarray:
    """[V] bool: ids of SentencePiece byte-fallback pieces (``<0xNN>``).

    Fast tokenizers report the offsets of the whole pre-token for each such piece, so
    their offsets cannot place the piece's byte; rows that contain one never use offsets.
    """
    try:
        return _FALLBACK[tok]
    except (KeyError, TypeError):
        pass
    vocab = tok.get_vocab()
    mask = np.zeros(max(vocab.values(), default=-1) + 1, dtype=bool)
    for token, idx in vocab.items():
        if _fallback_byte(token) is not None:
            mask[idx] = True
    try:
        _FALLBACK[tok] = mask
    except TypeError:
        pass
    return mask


def has_byte_fallback(mask: np.ndarray, ids: list[int]) -> bool:
    """Whether any of ``ids`` is a byte-fallback token (``mask`` from :func:`byte_fallback_mask`)."""
    if not mask.any() or not ids:
        return False
    arr = np.fromiter(ids, dtype=np.int64, count=len(ids))
    arr = arr[arr < len(mask)]
    return bool(mask[arr].any())
