"""Batched THL conversion for the learner's hot path.

Same results as :func:`mutualrl.thl.convert` item by item, but the tokenizer
work is four Rust batch calls (decode source, encode source and target with
offsets, decode target) and the alignment is vectorised:

- byte spans come from the fast tokenizers' offset mappings; only ids that are
  not the canonical encoding of their text (rare: the sampler took a
  non-canonical path) fall back to incremental decoding;
- group boundaries are the byte offsets where a source and a target token end
  together; token ``i`` belongs to the first boundary ``>= end_i`` (so
  zero-width tokens join the group they sit in), and log-probs move through
  ``bincount`` sums.
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
from transformers import PreTrainedTokenizerBase

from mutualrl.thl.alignment import AlignmentGroup, token_byte_spans
from mutualrl.thl.convert import Converted, Residual, _strip_eos, convert


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
    off = np.asarray(offsets, dtype=np.int64).reshape(n, 2)
    if text.isascii():
        starts, ends = off[:, 0], off[:, 1]
        total = len(text)
    else:
        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        char_bytes = 1 + (cps >= 0x80).astype(np.int64) + (cps >= 0x800) + (cps >= 0x10000)  # UTF-8 length per code point
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
    """Common boundaries and each token's group index on both sides."""
    boundaries = np.intersect1d(src_ends, tgt_ends)
    boundaries = boundaries[boundaries > 0] if len(boundaries) > 1 else boundaries
    return boundaries, np.searchsorted(boundaries, src_ends, side="left"), np.searchsorted(boundaries, tgt_ends, side="left")


def convert_batch(
    source_tok: PreTrainedTokenizerBase,
    target_tok: PreTrainedTokenizerBase,
    source_ids: list[list[int]],
    source_logprobs: list[list[float]] | None = None,
    placement: Literal["spread", "last"] = "spread",
    with_groups: bool = False,
) -> list[Converted]:
    """Convert many completions at once; ``with_groups`` also builds the AlignmentGroup objects
    (slower; the learner only needs the transported traces and the residual)."""
    if source_logprobs is not None and len(source_logprobs) != len(source_ids):
        raise ValueError(f"{len(source_logprobs)} log-prob rows for {len(source_ids)} id rows")
    ids_list, lps_list = [], []
    for k, ids in enumerate(source_ids):
        lps = source_logprobs[k] if source_logprobs is not None else None
        if lps is not None and len(lps) != len(ids):
            raise ValueError(f"row {k}: {len(lps)} log-probs for {len(ids)} ids")
        ids, lps = _strip_eos(source_tok, list(ids), list(lps) if lps is not None else None)
        ids_list.append(ids)
        lps_list.append(lps)
    texts = _decode_batch(source_tok, ids_list)
    src_enc = _encode_batch(source_tok, texts)
    tgt_enc = _encode_batch(target_tok, texts)
    tgt_texts = _decode_batch(target_tok, tgt_enc["input_ids"])

    out: list[Converted] = []
    for k, text in enumerate(texts):
        ids, lps = ids_list[k], lps_list[k]
        tgt_ids = tgt_enc["input_ids"][k]
        non_canonical = src_enc["input_ids"][k] != ids
        roundtrip = tgt_texts[k] == text
        src_ends = None if non_canonical else _byte_ends(src_enc["offset_mapping"][k], text)
        if src_ends is None and ids:
            src_ends = np.array([e for _, e in token_byte_spans(source_tok, ids, text)[1]], dtype=np.int64)
        tgt_ends = _byte_ends(tgt_enc["offset_mapping"][k], text) if roundtrip else None
        if not roundtrip or tgt_ends is None or src_ends is None or not ids or not tgt_ids:
            # the exact but slower path handles every irregular case (and reports it)
            out.append(convert(source_tok, target_tok, source_ids=ids, source_logprobs=lps, placement=placement))
            continue
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
                groups.append(AlignmentGroup(tuple(np.nonzero(src_g == g)[0].tolist()), tuple(np.nonzero(tgt_g == g)[0].tolist()), int(starts[g]), int(boundaries[g])))
        out.append(
            Converted(
                text=text,
                target_ids=list(tgt_ids),
                groups=groups,
                residual=Residual(0.0, float(eta), len(tgt_ids) / len(ids), True, bool(non_canonical)),
                target_logprobs=target_lps,
                target_mask=[1] * len(tgt_ids),
                source_mean_logprob=mean_lp,
            )
        )
    return out
