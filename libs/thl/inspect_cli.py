"""``mutualrl thl inspect``: show how one text moves between two tokenizers."""

from __future__ import annotations

import json

from transformers import PreTrainedTokenizerBase

from mutualrl.thl.convert import convert


def inspect_text(source: PreTrainedTokenizerBase, target: PreTrainedTokenizerBase, text: str) -> dict:
    """Both tokenizations, the alignment groups and the residual, as plain data (the ``--json`` shape)."""
    source_ids = source(text, add_special_tokens=False)["input_ids"]
    conv = convert(source, target, source_ids=source_ids, source_logprobs=[0.0] * len(source_ids))
    return {
        "text": conv.text,
        "source_ids": source_ids,
        "source_tokens": source.convert_ids_to_tokens(source_ids),
        "target_ids": conv.target_ids,
        "target_tokens": target.convert_ids_to_tokens(conv.target_ids),
        "groups": [g.to_dict() for g in conv.groups],
        "residual": conv.residual.to_dict(),
    }


def render_text(report: dict) -> str:
    lines = [f"text: {report['text']!r}"]
    lines.append(f"source ({len(report['source_ids'])} tokens): {report['source_tokens']}")
    lines.append(f"target ({len(report['target_ids'])} tokens): {report['target_tokens']}")
    lines.append("groups (source idx -> target idx, bytes):")
    text_b = report["text"].encode("utf-8")
    for g in report["groups"]:
        s, e = g["bytes"]
        lines.append(f"  {g['source']} -> {g['target']}  [{s}, {e})  {text_b[s:e].decode('utf-8', 'replace')!r}")
    lines.append("residual: " + json.dumps(report["residual"]))
    return "\n".join(lines)
