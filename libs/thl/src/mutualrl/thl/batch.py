"""Batched THL conversion for the learner's hot path.

Same results as :func:`mutualrl.thl.convert` item by item, but the tokenizer
work is Rust batch calls and the alignment is vectorised:

- byte-level BPE vocabularies (GPT-2, Qwen, Llama 3) give text, byte spans and
  the round trip by table lookup (``vocab_bytes``), so the only tokenizer work
  is two id-only encodes: the receiver's ids and the source's canonical check;
- other kinds take byte spans from the fast tokenizers' offset mappings (decode
  source, encode both with offsets, decode target); ids that are not the
  canonical encoding of their text fall back to incremental decoding;
- group boundaries are the byte offsets where a source and a target token end
  together; token ``i`` belongs to the first boundary ``>= end_i`` (so
  zero-width tokens join the group they sit in), and log-probs move through
  ``bincount`` sums.
"""

from __future__ import annotations

from itertools import chain
from typing import Literal, Sequence

import numpy as np
from transformers import PreTrainedTokenizerBase

from mutualrl.thl.alignment import AlignmentGroup, token_byte_spans
from mutualrl.thl.convert import Converted, Residual, _strip_eos, convert
from mutualrl.thl.vocab_bytes import VocabBytes, byte_fallback_mask, has_byte_fallback, vocab_bytes


def _backend(tok: PreTrainedTokenizerBase):
    """The Rust tokenizer behind a fast tokenizer (skipping the Python wrapper's per-item work),
    or None for slow tokenizers."""
    return getattr(tok, "backend_tokenizer", None) if getattr(tok, "is_fast", False) else None


def _encode_batch(tok: PreTrainedTokenizerBase, texts: list[str]) -> dict:
    be = _backend(tok)
    if be is None:
        return tok(texts, add_special_tokens=False, return_offsets_mapping=True)
    encs = be.encode_batch(texts, add_special_tokens=False)
    return {"input_ids": [e.ids for e in encs], "offset_mapping": [e.offsets for e in encs]}


def _decode_batch(tok: PreTrainedTokenizerBase, ids: list[list[int]]) -> list[str]:
    be = _backend(tok)
    if be is None:
        return tok.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return be.decode_batch(ids, skip_special_tokens=True)


def _byte_ends(offsets: Sequence[tuple[int, int]], text: str) -> np.ndarray | None:
    """Byte end of each token from char offsets; None when the offsets cannot tile the text."""
    n = len(offsets)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    off = np.fromiter(chain.from_iterable(offsets), dtype=np.int64, count=2 * n).reshape(n, 2)
    if text.isascii():
        starts, ends = off[:, 0], off[:, 1]
        total = len(text)
    else:
        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        # UTF-8 length per code point
        char_bytes = 1 + (cps >= 0x80).astype(np.int64) + (cps >= 0x800) + (cps >= 0x10000)
        prefix = np.concatenate([[0], np.cumsum(char_bytes)])
        starts, ends = prefix[off[:, 0]], prefix[off[:, 1]]
        total = int(prefix[-1])
    # a token ending inside a character shares that character's offsets with the next token:
    # it ends where the next one starts (zero width), as incremental decoding says
    ends = ends.copy()
    ends[:-1] = np.minimum(ends[:-1], starts[1:])
    ends = np.maximum.accumulate(ends)
    if ends[-1] != total:
        return None
    return ends


def _groups(src_ends: np.ndarray, tgt_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Common boundaries and each token's group index on both sides.

    Token i belongs to the first boundary ``>= end_i``; a zero-width token sitting on a
    boundary belongs to the group after it (as in :func:`align_spans`).
    """
    boundaries = np.intersect1d(src_ends, tgt_ends)
    boundaries = boundaries[boundaries > 0] if len(boundaries) > 1 else boundaries

    def index(ends: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(boundaries, ends, side="left")
        if len(ends) > 1:
            zero = np.r_[False, ends[1:] == ends[:-1]] & np.isin(ends, boundaries)
            idx = np.minimum(idx + zero, len(boundaries) - 1)
        return idx

    return boundaries, index(src_ends), index(tgt_ends)


def _encode_ids(tok: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    """Ids only (the Rust ``encode_batch_fast`` skips offset bookkeeping)."""
    be = _backend(tok)
    if be is None:
        return tok(texts, add_special_tokens=False)["input_ids"]
    fast = getattr(be, "encode_batch_fast", be.encode_batch)
    return [e.ids for e in fast(texts, add_special_tokens=False)]


def _table_ends(table: VocabBytes | None, ids: list[int]) -> tuple[bytes, np.ndarray] | None:
    """(bytes, byte end of each token) from the vocabulary table; None when a token is irregular."""
    if table is None or not ids:
        return None
    arr = np.fromiter(ids, dtype=np.int64, count=len(ids))
    if arr.max() >= len(table.regular) or arr.min() < 0 or not table.regular[arr].all():
        return None
    return table.join(ids), np.cumsum(table.lengths[arr])


def convert_batch(
    source_tok: PreTrainedTokenizerBase,
    target_tok: PreTrainedTokenizerBase,
    source_ids: list[list[int]],
    source_logprobs: list[list[float]] | None = None,
    placement: Literal["spread", "last"] = "spread",
    with_groups: bool = False,
    source_canonical: Sequence[bool | None] | None = None,
) -> list[Converted]:
    """Convert many completions at once; ``with_groups`` also builds the AlignmentGroup objects
    (slower; the learner only needs the transported traces and the residual).

    ``source_canonical`` carries the producer's own non-canonical check per row (the
    ``canonical`` field of a Rollout): rows that have it skip the source re-encode; rows
    with ``None`` are checked here. A wrong claim can only mislabel the residual flag:
    the transported log-probs are the sampled path's either way.

    Byte-level vocabularies take the table path (:mod:`mutualrl.thl.vocab_bytes`): text and
    byte spans by lookup, the round trip checked on bytes. Every other case, and every
    irregular row (special or added tokens, a multi-byte character split at the end, a
    non-canonical path without a table), takes the exact reference :func:`convert`.
    """
    if source_logprobs is not None and len(source_logprobs) != len(source_ids):
        raise ValueError(f"{len(source_logprobs)} log-prob rows for {len(source_ids)} id rows")
    ids_list, lps_list = _stripped_rows(source_tok, source_ids, source_logprobs)
    n = len(ids_list)
    if source_canonical is not None and len(source_canonical) != n:
        raise ValueError(f"{len(source_canonical)} canonical flags for {n} rows")
    texts, src_ends, exact = _source_texts(source_tok, ids_list)  # 1. canonical text and source byte ends
    batch = [k for k in range(n) if not exact[k]]
    # 2. the non-canonical flag
    src_ids, src_offsets = _source_reencoded(source_tok, ids_list, texts, src_ends, batch, source_canonical)
    # 3. the receiver's ids, byte ends and round trip
    tgt_ids, tgt_ends, roundtrip = _target_side(target_tok, texts, batch, exact)

    # 4. each row: the exact converter for irregular rows, else its byte ends into the aligner
    out: list[Converted | None] = [None] * n
    fast: list[tuple[int, str, list[int], list[float] | None, list[int], np.ndarray, np.ndarray, bool]] = []
    for k in range(n):
        ids, lps = ids_list[k], lps_list[k]
        if exact[k]:
            out[k] = convert(source_tok, target_tok, source_ids=list(source_ids[k]),
                             source_logprobs=_raw_lps(source_logprobs, k), placement=placement)
            continue
        text = texts[k]
        assert text is not None
        t_ids = tgt_ids[k]
        non_canonical = src_ids[k] != ids
        s_ends = src_ends[k]
        if s_ends is None and not non_canonical and ids and not has_byte_fallback(byte_fallback_mask(source_tok), ids):
            s_ends = _byte_ends(src_offsets[k], text)
        if s_ends is None and ids:
            s_ends = np.array([e for _, e in token_byte_spans(source_tok, ids, text)[1]], dtype=np.int64)
        t_ends = tgt_ends.get(k)
        if not roundtrip[k] or t_ends is None or s_ends is None or not ids or not t_ids:
            # the exact but slower path handles every irregular case (and reports it)
            out[k] = convert(source_tok, target_tok, source_ids=list(source_ids[k]),
                             source_logprobs=_raw_lps(source_logprobs, k), placement=placement)
            continue
        if with_groups:
            out[k] = _aligned(text, ids, lps, t_ids, s_ends, t_ends, non_canonical, placement, with_groups)
        else:
            fast.append((k, text, ids, lps, t_ids, s_ends, t_ends, non_canonical))
    for k, conv in _aligned_many(fast, placement):
        out[k] = conv
    return out  # type: ignore[return-value]


def _stripped_rows(source_tok: PreTrainedTokenizerBase, source_ids: list[list[int]],
                   source_logprobs: list[list[float]] | None) -> tuple[list[list[int]], list[list[float] | None]]:
    """Each row without its terminal EOS (outside the probability contract, docs/algorithms.md §2.10), checked for one
    log-prob per id."""
    ids_list, lps_list = [], []
    for k, ids in enumerate(source_ids):
        lps = source_logprobs[k] if source_logprobs is not None else None
        if lps is not None and len(lps) != len(ids):
            raise ValueError(f"row {k}: {len(lps)} log-probs for {len(ids)} ids")
        ids, lps = _strip_eos(source_tok, list(ids), list(lps) if lps is not None else None)
        ids_list.append(ids)
        lps_list.append(lps)
    return ids_list, lps_list


def _source_texts(source_tok: PreTrainedTokenizerBase, ids_list: list[list[int]]) -> tuple[list[str | None],
        list[np.ndarray | None], list[bool]]:
    """Each row's text and the byte end of each source token: by table lookup, else a batch decode
    (no byte ends then). A row whose bytes are not UTF-8 (a byte-level token split a multi-byte
    character) is marked for the exact converter."""
    n = len(ids_list)
    texts: list[str | None] = [None] * n
    src_ends: list[np.ndarray | None] = [None] * n
    exact = [False] * n  # rows handed to the reference converter
    need_decode = []
    src_table = vocab_bytes(source_tok)
    for k, ids in enumerate(ids_list):
        hit = _table_ends(src_table, ids)
        if hit is None:
            need_decode.append(k)
            continue
        try:
            texts[k] = hit[0].decode("utf-8")
            src_ends[k] = hit[1]
        except UnicodeDecodeError:
            exact[k] = True
    if need_decode:
        for k, t in zip(need_decode, _decode_batch(source_tok, [ids_list[k] for k in need_decode])):
            texts[k] = t
    return texts, src_ends, exact


def _source_reencoded(source_tok: PreTrainedTokenizerBase, ids_list: list[list[int]], texts: list[str | None],
                      src_ends: list[np.ndarray | None],
                      batch: list[int], source_canonical: Sequence[bool | None] | None) -> tuple[dict, dict]:
    """The canonical encoding of each row's text (a row whose sampled ids differ is non-canonical),
    skipped where the producer's own claim is given; and the source offsets where no table gave the byte ends."""
    given = source_canonical if source_canonical is not None else [None] * len(ids_list)
    claimed = {k: given[k] for k in batch if given[k] is not None}
    if all(src_ends[k] is not None for k in batch):
        todo = [k for k in batch if k not in claimed]
        src_ids = dict(zip(todo, _encode_ids(source_tok, [texts[k] or "" for k in todo]))) if todo else {}
        for k, flag in claimed.items():
            src_ids[k] = ids_list[k] if flag else None  # type: ignore[assignment]
        return src_ids, {}
    enc = _encode_batch(source_tok, [texts[k] or "" for k in batch])
    return dict(zip(batch, enc["input_ids"])), dict(zip(batch, enc["offset_mapping"]))


def _target_side(target_tok: PreTrainedTokenizerBase, texts: list[str | None], batch: list[int],
                 exact: list[bool]) -> tuple[dict[int, list[int]], dict[int, np.ndarray | None], dict[int, bool]]:
    """The receiver's ids of each row's text, the byte end of each of its tokens and whether the
    text survives its round trip; rows the table cannot cover are marked for the exact converter."""
    batch_texts = [texts[k] or "" for k in batch]
    tgt_ids: dict[int, list[int]] = {}
    tgt_ends: dict[int, np.ndarray | None] = {}
    roundtrip: dict[int, bool] = {}
    tgt_table = vocab_bytes(target_tok)
    if tgt_table is not None:
        tgt_ids = dict(zip(batch, _encode_ids(target_tok, batch_texts)))
        for k in batch:
            hit = _table_ends(tgt_table, tgt_ids[k])
            if hit is None:
                exact[k] = True
            else:
                roundtrip[k] = hit[0] == texts[k].encode("utf-8")  # type: ignore[union-attr]
                tgt_ends[k] = hit[1] if roundtrip[k] else None
        return tgt_ids, tgt_ends, roundtrip
    enc = _encode_batch(target_tok, batch_texts)
    decoded = _decode_batch(target_tok, enc["input_ids"])
    fallback = byte_fallback_mask(target_tok)
    for k, ids_k, off, dec in zip(batch, enc["input_ids"], enc["offset_mapping"], decoded):
        tgt_ids[k] = ids_k
        roundtrip[k] = dec == texts[k]
        usable = roundtrip[k] and not has_byte_fallback(fallback, ids_k)
        tgt_ends[k] = _byte_ends(off, texts[k]) if usable else None  # type: ignore[arg-type]
    return tgt_ids, tgt_ends, roundtrip


def _raw_lps(source_logprobs: list[list[float]] | None, k: int) -> list[float] | None:
    """Row k as the caller gave it (the reference converter strips the EOS itself)."""
    return list(source_logprobs[k]) if source_logprobs is not None else None


def _sorted_member(x: np.ndarray, sorted_ref: np.ndarray) -> np.ndarray:
    """``np.isin`` for a sorted reference array, by binary search."""
    if len(sorted_ref) == 0:
        return np.zeros(len(x), dtype=bool)
    i = np.minimum(np.searchsorted(sorted_ref, x), len(sorted_ref) - 1)
    return sorted_ref[i] == x


def _sorted_common(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sorted unique values present in both non-decreasing arrays."""
    c = a[_sorted_member(a, b)]
    return c[np.r_[True, c[1:] != c[:-1]]] if len(c) else c


def _aligned_many(rows: list, placement: str) -> list[tuple[int, Converted]]:
    """:func:`_aligned` for many fully covered rows at once: rows are laid end to end on one
    byte axis (a one-byte gap between rows, so no boundary is shared across rows), grouped
    with one ``intersect1d``/``searchsorted``, and log-probs moved with one ``bincount``."""
    if not rows:
        return []
    totals = np.array([int(r[5][-1]) for r in rows], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(totals + 1)[:-1]])
    n_src = np.array([len(r[5]) for r in rows])
    n_tgt = np.array([len(r[6]) for r in rows])
    S = np.concatenate([r[5] for r in rows]) + np.repeat(offsets, n_src)
    T = np.concatenate([r[6] for r in rows]) + np.repeat(offsets, n_tgt)
    b = _sorted_common(S, T)  # S and T are sorted: no hashing needed
    b = b[~_sorted_member(b, offsets)]  # a token ending at its row's byte 0 opens the row's first group

    def index(ends: np.ndarray, counts: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(b, ends, side="left")
        same = ends[1:] == ends[:-1]
        if same.any():  # zero-width tokens on a boundary belong to the next group of their row
            row_last = np.repeat(np.searchsorted(b, offsets + totals, side="left"), counts)
            zero = np.r_[False, same] & _sorted_member(ends, b)
            idx = np.where(zero, np.minimum(idx + 1, row_last), idx)
        return idx

    src_g, tgt_g = index(S, n_src), index(T, n_tgt)
    has_lps = all(r[3] is not None for r in rows)
    tl_all = None
    if has_lps:
        lp = np.concatenate([np.asarray(r[3], dtype=np.float64) for r in rows])
        sums = np.bincount(src_g, weights=lp, minlength=len(b))
        if placement == "spread":
            tl_all = sums[tgt_g] / np.bincount(tgt_g, minlength=len(b))[tgt_g]
        else:
            last = np.r_[tgt_g[1:] != tgt_g[:-1], True]
            tl_all = np.where(last, sums[tgt_g], 0.0)
        src_sums = np.add.reduceat(lp, np.r_[0, np.cumsum(n_src)[:-1]])
        tgt_sums = np.add.reduceat(tl_all, np.r_[0, np.cumsum(n_tgt)[:-1]])
        tl_rows = np.split(tl_all, np.cumsum(n_tgt)[:-1])
    out = []
    for j, (k, text, ids, lps, t_ids, _, _, non_canonical) in enumerate(rows):
        eta = float(abs(tgt_sums[j] - src_sums[j])) if has_lps else 0.0
        out.append(
            (
                k,
                Converted(
                    text=text,
                    target_ids=list(t_ids),
                    groups=[],
                    residual=Residual(0.0, eta, len(t_ids) / len(ids), True, bool(non_canonical)),
                    target_logprobs=tl_rows[j].tolist() if has_lps else None,
                    target_mask=[1] * len(t_ids),
                    source_mean_logprob=(float(src_sums[j]) / len(ids)) if has_lps else None,
                ),
            )
        )
    return out


def _aligned(
    text: str,
    ids: list[int],
    lps: list[float] | None,
    tgt_ids: list[int],
    src_ends: np.ndarray,
    tgt_ends: np.ndarray,
    non_canonical: bool,
    placement: str,
    with_groups: bool,
) -> Converted:
    """A fully covered row: groups from coinciding byte ends, log-probs through bincount sums."""
    boundaries, src_g, tgt_g = _groups(src_ends, tgt_ends)
    n_groups = len(boundaries)
    target_lps = None
    eta = 0.0
    mean_lp = None
    if lps is not None:
        sums = np.bincount(src_g, weights=np.asarray(lps, dtype=np.float64), minlength=n_groups)
        if placement == "spread":
            counts = np.bincount(tgt_g, minlength=n_groups)
            target_lps = (sums[tgt_g] / counts[tgt_g]).tolist()
        else:
            last = np.r_[tgt_g[1:] != tgt_g[:-1], True]
            target_lps = np.where(last, sums[tgt_g], 0.0).tolist()
        eta = abs(sum(target_lps) - sum(lps))
        mean_lp = sum(lps) / len(lps)
    groups: list[AlignmentGroup] = []
    if with_groups:
        starts = np.r_[0, boundaries[:-1]]
        for g in range(n_groups):
            groups.append(AlignmentGroup(tuple(np.nonzero(src_g == g)[0].tolist()),
                                         tuple(np.nonzero(tgt_g == g)[0].tolist()), int(starts[g]), int(boundaries[g])))
    return Converted(
        text=text,
        target_ids=list(tgt_ids),
        groups=groups,
        residual=Residual(0.0, float(eta), len(tgt_ids) / len(ids), True, bool(non_canonical)),
        target_logprobs=target_lps,
        target_mask=[1] * len(tgt_ids),
        source_mean_logprob=mean_lp,
    )
