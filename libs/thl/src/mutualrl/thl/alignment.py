"""Byte spans per token and many-to-many alignment groups (docs/algorithms.md §3.2 step 2, §4).

Byte-level BPE vocabularies give exact spans by table lookup (a token that
splits a multi-byte character owns its bytes, so it groups with the token that
completes the character). Every other kind uses incremental decoding, which
works without offset mappings (Metaspace/Unigram, WordLevel, WordPiece); there a
token that ends inside a multi-byte character (a byte-fallback piece) gets a
zero-width span at the last complete character boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from mutualrl.thl.vocab_bytes import vocab_bytes

REPLACEMENT = "\ufffd"


def _decode(tok: PreTrainedTokenizerBase, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def token_byte_spans(tok: PreTrainedTokenizerBase, ids: list[int],
                     text: str | None = None) -> tuple[str, list[tuple[int, int]]]:
    """Decoded text and the ``[start, end)`` UTF-8 byte span of every token in ``ids``.

    Special tokens get zero-width spans. Ends are non-decreasing and the last one
    equals the byte length of the decoded text.
    """
    full = _decode(tok, ids) if text is None else text
    full_b = full.encode("utf-8")
    table = vocab_bytes(tok)
    if table is not None and ids and all(0 <= i < len(table.regular) and table.regular[i] for i in ids):
        if table.join(ids) == full_b:
            # byte-level BPE: exact spans, a token that splits a character owns its bytes
            spans, prev = [], 0
            for i in ids:
                spans.append((prev, prev + int(table.lengths[i])))
                prev += int(table.lengths[i])
            return full, spans
    spans: list[tuple[int, int]] = []
    prev = 0
    for i in range(len(ids)):
        prefix = _decode(tok, ids[: i + 1])
        if prefix.endswith(REPLACEMENT) and not full.startswith(prefix):
            prefix = prefix.rstrip(REPLACEMENT)  # token ends mid-character: boundary not reached yet
        end = len(prefix.encode("utf-8"))
        if not full_b.startswith(prefix.encode("utf-8")):
            # Decoding is not prefix-stable here (e.g. a decoder that strips a leading
            # space only at the start); fall back to the longest common prefix.
            end = _common_prefix_len(full_b, prefix.encode("utf-8"))
        end = max(prev, min(end, len(full_b)))
        spans.append((prev, end))
        prev = end
    if spans and prev < len(full_b):
        s, _ = spans[-1]
        spans[-1] = (s, len(full_b))
    return full, spans


def _common_prefix_len(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class AlignmentGroup:
    """Source and target token indices covering exactly the bytes ``[start, end)``."""

    source: tuple[int, ...]
    target: tuple[int, ...]
    start: int
    end: int

    def to_dict(self) -> dict:
        """The group as JSON: source and target token indices and its byte span."""
        return {"source": list(self.source), "target": list(self.target), "bytes": [self.start, self.end]}


def align_spans(src: list[tuple[int, int]], tgt: list[tuple[int, int]]) -> list[AlignmentGroup]:
    """Greedy two-pointer grouping at coinciding byte boundaries.

    Both span lists must tile the same byte range ``[0, N)``. A group closes when
    the source and target ends coincide; zero-width tokens join the group that
    follows them (the one whose token completes their character), or the last
    group at the end of the text. The result partitions the bytes and every token index appears in
    exactly one group.
    """
    groups: list[AlignmentGroup] = []
    i = j = 0
    start = 0
    cur_s: list[int] = []
    cur_t: list[int] = []
    while i < len(src) or j < len(tgt):
        s_end = src[i][1] if i < len(src) else None
        t_end = tgt[j][1] if j < len(tgt) else None
        if t_end is None or (s_end is not None and s_end < t_end):
            cur_s.append(i)
            i += 1
        elif s_end is None or t_end < s_end:
            cur_t.append(j)
            j += 1
        else:
            cur_s.append(i)
            cur_t.append(j)
            i += 1
            j += 1
            if s_end == start:
                continue  # a zero-width boundary (tokens at byte 0): keep growing the first group
            # zero-width tokens right after this boundary open the next group: they are the
            # leading pieces of the character the next token completes
            groups.append(AlignmentGroup(tuple(cur_s), tuple(cur_t), start, s_end))
            start = s_end
            cur_s, cur_t = [], []
    if cur_s or cur_t:
        end = max([src[k][1] for k in cur_s] + [tgt[k][1] for k in cur_t] + [start])
        groups.append(AlignmentGroup(tuple(cur_s), tuple(cur_t), start, end))
    return _merge_one_sided(groups)


def _merge_one_sided(groups: list[AlignmentGroup]) -> list[AlignmentGroup]:
    """Fold groups that have tokens on one side only into a neighbour (the next, else the previous).

    Such groups are zero-width tokens (``<unk>``, specials dropped by decoding)
    with nowhere of their own to go; left alone, a source token's log-prob mass
    would vanish without the residual saying so. When no group has tokens on
    both sides nothing can be merged, and the caller reports the loss.
    """
    out: list[AlignmentGroup] = []
    carry: AlignmentGroup | None = None
    for g in groups:
        if carry is not None:
            g = AlignmentGroup(carry.source + g.source, carry.target + g.target, carry.start, g.end)
            carry = None
        if not g.source or not g.target:
            carry = g
            continue
        out.append(g)
    if carry is not None:
        if out:
            last = out.pop()
            out.append(AlignmentGroup(last.source + carry.source, last.target + carry.target, last.start,
                                      max(last.end, carry.end)))
        else:
            out.append(carry)
    return out
