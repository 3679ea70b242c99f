"""Conversion of one completion between tokenizers, with its residual (docs/algorithms.md §3.2)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from transformers import PreTrainedTokenizerBase

from mutualrl.thl.alignment import AlignmentGroup, align_spans, token_byte_spans


@dataclass(frozen=True)
class Residual:
    """What retokenisation could not carry over exactly (§3.2 step 5).

    unaligned_fraction: bytes in groups whose source and target bytes differ, over all bytes (u).
    logprob_residual:   |Σ transported log-probs − Σ source log-probs| (η_seq; 0 when fully covered).
    length_ratio:       |y|_target / |y|_source (λ_len).
    roundtrip_ok:       decode_target(encode_target(text)) == text.
    non_canonical:      encode_source(text) != the source's sampled ids (string log-prob != path log-prob).
    """

    unaligned_fraction: float = 0.0
    logprob_residual: float = 0.0
    length_ratio: float = 1.0
    roundtrip_ok: bool = True
    non_canonical: bool = False

    def to_dict(self) -> dict:
        """The residual as a dict (metrics and ``thl inspect``)."""
        return asdict(self)


@dataclass(frozen=True)
class ThlBudget:
    """Limits a converted message must meet to be used (``thl.*`` in the config)."""

    max_unaligned: float = 0.02
    require_roundtrip: bool = True

    def rejection(self, r: Residual) -> str | None:
        """The reason this residual is over budget, or None when it is within it."""
        if self.require_roundtrip and not r.roundtrip_ok:
            return "roundtrip"
        if r.unaligned_fraction > self.max_unaligned:
            return "unaligned"
        return None


@dataclass
class Converted:
    """A peer message retokenised for the learner, with its transported log-probs and residuals."""
    text: str
    target_ids: list[int]  # receiver's completion ids, no EOS (the receiver appends its own)
    groups: list[AlignmentGroup]
    residual: Residual
    target_logprobs: list[float] | None = None  # transported source log-probs per target token
    target_mask: list[int] = field(default_factory=list)  # 1 where the token is in an aligned group
    source_mean_logprob: float | None = None  # ℓ̄_source over non-EOS source tokens (for GSPO/HACPO ratios)


def _strip_eos(tok: PreTrainedTokenizerBase, ids: list[int], logprobs: list[float] | None):
    if ids and tok.eos_token_id is not None and ids[-1] == tok.eos_token_id:
        return ids[:-1], (logprobs[:-1] if logprobs is not None else None)
    return ids, logprobs


def canonical_text(tok: PreTrainedTokenizerBase, ids: list[int]) -> str:
    """The producer's completion as text: terminal EOS stripped, decoded without special tokens
    and without clean-up (§2.10), so spaces and punctuation survive exactly."""
    ids, _ = _strip_eos(tok, list(ids), None)
    return tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def transport_logprobs(
    groups: list[AlignmentGroup],
    aligned: list[bool],
    source_logprobs: list[float],
    n_target: int,
    placement: Literal["spread", "last"] = "spread",
) -> tuple[list[float], list[int]]:
    """Move per-token log-probs through alignment groups (§3.2 step 3).

    Each aligned group's sum ``L_g = Σ_{s∈g} ℓ_s`` is spread evenly over its
    target tokens (``spread``) or put on its last target token (``last``); the
    group sum is preserved exactly either way. Target tokens in unaligned groups
    get log-prob 0 and mask 0.
    """
    out = [0.0] * n_target
    mask = [0] * n_target
    for g, ok in zip(groups, aligned):
        if not ok or not g.target:
            continue
        total = sum(source_logprobs[s] for s in g.source)
        if placement == "spread":
            for t in g.target:
                out[t] = total / len(g.target)
        else:
            out[g.target[-1]] = total
        for t in g.target:
            mask[t] = 1
    return out, mask


def convert(
    source_tok: PreTrainedTokenizerBase | None,
    target_tok: PreTrainedTokenizerBase,
    *,
    source_ids: list[int] | None = None,
    text: str | None = None,
    source_logprobs: list[float] | None = None,
    placement: Literal["spread", "last"] = "spread",
) -> Converted:
    """Carry one completion from the source tokenizer to the target tokenizer.

    Give ``source_ids`` (and optionally their ``source_logprobs``) to carry a
    token-level trace; ``text`` alone converts text only (then the residual
    describes only the target side). When both are given the ids are the truth
    and ``text`` must equal their canonical decode.
    """
    if source_ids is None and text is None:
        raise ValueError("convert needs source_ids or text")
    if source_logprobs is not None and (source_ids is None or len(source_logprobs) != len(source_ids)):
        raise ValueError(
            f"source_logprobs ({len(source_logprobs)}) must match source_ids "
            f"({len(source_ids) if source_ids is not None else 'missing'})"
        )
    if source_ids is not None:
        if source_tok is None:
            raise ValueError("source_ids need the source tokenizer")
        ids, lps = _strip_eos(source_tok, list(source_ids),
                              list(source_logprobs) if source_logprobs is not None else None)
        canon = canonical_text(source_tok, ids)
        if text is not None and text != canon:
            raise ValueError("text does not match the canonical decode of source_ids")
        text = canon
    else:
        ids, lps = None, None
    assert text is not None

    target_ids = target_tok(text, add_special_tokens=False)["input_ids"]
    tgt_text, tgt_spans = token_byte_spans(target_tok, target_ids)
    roundtrip_ok = tgt_text == text
    non_canonical = False
    if ids is not None and source_tok is not None:
        _, src_spans = token_byte_spans(source_tok, ids, text)
        non_canonical = source_tok(text, add_special_tokens=False)["input_ids"] != ids
    else:
        src_spans = [(0, len(text.encode("utf-8")))] if text else []

    groups = align_spans(src_spans, tgt_spans)
    src_b, tgt_b = text.encode("utf-8"), tgt_text.encode("utf-8")
    aligned = [bool(g.source) and bool(g.target) and src_b[g.start : g.end] == tgt_b[g.start : g.end] for g in groups]
    total_bytes = max(len(src_b), len(tgt_b))
    unaligned_bytes = sum(g.end - g.start for g, ok in zip(groups, aligned) if not ok)
    unaligned_bytes += abs(len(src_b) - len(tgt_b)) if groups and groups[-1].end < total_bytes else 0
    unaligned = unaligned_bytes / total_bytes if total_bytes else 0.0
    if ids and not any(g.source and g.target for g in groups):
        unaligned = 1.0  # source tokens exist but nothing could be carried (e.g. only <unk> or specials)

    target_lps = target_mask = None
    eta = 0.0
    mean_lp = None
    if lps is not None:
        target_lps, target_mask = transport_logprobs(groups, aligned, lps, len(target_ids), placement)
        eta = abs(sum(target_lps) - sum(lps))
        mean_lp = sum(lps) / len(lps) if lps else 0.0
    n_src = len(ids) if ids is not None else len(target_ids)
    residual = Residual(
        unaligned_fraction=float(min(1.0, unaligned)),
        logprob_residual=float(eta),
        length_ratio=(len(target_ids) / n_src) if n_src else 1.0,
        roundtrip_ok=roundtrip_ok,
        non_canonical=non_canonical,
    )
    return Converted(
        text=text,
        target_ids=list(target_ids),
        groups=groups,
        residual=residual,
        target_logprobs=target_lps,
        target_mask=target_mask if target_mask is not None else [1] * len(target_ids),
        source_mean_logprob=mean_lp,
    )
