"""``mutualrl thl inspect``: show how one text moves between two tokenizers.

The text is what a person typed, not what either vocabulary can spell: a character vocabulary
trained on sums maps "What is" to ``<unk>`` tokens, and decoding those without special tokens
silently drops them. So both sides are checked against the *typed* text — what each tokenizer
loses is reported (the characters, and the bytes counted into the unaligned fraction), never
hidden behind the conversion of what survived.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import replace
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from mutualrl.thl.convert import canonical_text, convert

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def holds_tokenizer(folder: Path) -> bool:
    """Whether ``folder`` holds a tokenizer's files."""
    return folder.is_dir() and any((folder / f).is_file() for f in TOKENIZER_FILES)


def tokenizer_folders(root: Path, depth: int = 4, limit: int = 20) -> list[Path]:
    """Folders under ``root`` that hold a tokenizer (a run's ``checkpoints/<policy>`` does)."""
    found: list[Path] = []
    frontier = [root]
    for _ in range(depth + 1):
        nxt = []
        for d in frontier:
            if holds_tokenizer(d):
                found.append(d)
            try:
                nxt += sorted(c for c in d.iterdir() if c.is_dir() and not c.name.startswith("."))
            except OSError:
                continue
        frontier = nxt
        if len(found) >= limit:
            break
    return found[:limit]


def _lost(text: str, kept: str) -> tuple[int, list[str]]:
    """Bytes of ``text`` missing from ``kept`` and the distinct characters lost."""
    a, b = text.encode("utf-8"), kept.encode("utf-8")
    matched = sum(m.size for m in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks())
    chars = sorted({c for c in text if c not in kept}) if kept != text else []
    return len(a) - matched, chars


def _unk_count(tok: PreTrainedTokenizerBase, ids: list[int]) -> int:
    return sum(1 for i in ids if tok.unk_token_id is not None and i == tok.unk_token_id)


def inspect_text(source: PreTrainedTokenizerBase, target: PreTrainedTokenizerBase, text: str) -> dict:
    """Both tokenizations, the alignment groups and the residual, as plain data (the ``--json`` shape).

    ``residual`` is the conversion's (docs/algorithms.md §3.2) measured against the typed text:
    ``roundtrip_ok`` holds only when both tokenizers give the text back, and bytes either one
    cannot spell count as unaligned."""
    source_ids = source(text, add_special_tokens=False)["input_ids"]
    source_text = canonical_text(source, source_ids)
    conv = convert(source, target, source_ids=source_ids, source_logprobs=[0.0] * len(source_ids))
    target_direct = target(text, add_special_tokens=False)["input_ids"]
    target_text = target.decode(target_direct, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    lost_src, chars_src = _lost(text, source_text)
    lost_tgt, chars_tgt = _lost(text, target_text)
    total = len(text.encode("utf-8")) or 1
    residual = replace(
        conv.residual,
        roundtrip_ok=conv.residual.roundtrip_ok and source_text == text and target_text == text,
        unaligned_fraction=min(1.0, max(conv.residual.unaligned_fraction, max(lost_src, lost_tgt) / total)),
    )
    return {
        "text": text,
        "carried_text": conv.text,
        "source_ids": source_ids,
        "source_tokens": source.convert_ids_to_tokens(source_ids),
        "target_ids": conv.target_ids,
        "target_tokens": target.convert_ids_to_tokens(conv.target_ids),
        "groups": [g.to_dict() for g in conv.groups],
        "source_spells_text": source_text == text,
        "target_spells_text": target_text == text,
        "source_unk_tokens": _unk_count(source, source_ids),
        "target_unk_tokens": _unk_count(target, target_direct),
        "source_lost_chars": chars_src,
        "target_lost_chars": chars_tgt,
        "residual": residual.to_dict(),
    }


def render_text(report: dict) -> str:
    """``thl inspect``'s report as text: what each side cannot spell first, then both tokenizations and the residual."""
    lines = [f"text: {report['text']!r}"]
    for side in ("source", "target"):
        if not report[f"{side}_spells_text"]:
            lines.append(f"WARNING: the {side} tokenizer cannot spell this text: {report[f'{side}_unk_tokens']} "
                         f"unknown tokens, characters lost: {''.join(report[f'{side}_lost_chars'])!r}")
    if report["carried_text"] != report["text"]:
        lines.append(f"carried: {report['carried_text']!r} (what the source's tokens decode to)")
    lines.append(f"source ({len(report['source_ids'])} tokens): {report['source_tokens']}")
    lines.append(f"target ({len(report['target_ids'])} tokens): {report['target_tokens']}")
    lines.append("groups (source idx -> target idx, bytes):")
    text_b = report["carried_text"].encode("utf-8")
    for g in report["groups"]:
        s, e = g["bytes"]
        lines.append(f"  {g['source']} -> {g['target']}  [{s}, {e})  {text_b[s:e].decode('utf-8', 'replace')!r}")
    lines.append("residual: " + json.dumps(report["residual"]))
    return "\n".join(lines)
