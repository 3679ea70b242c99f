"""How much of a bf16 engine's weights one learner step changes: the fraction of bf16 values that differ between
two consecutive published versions, per tensor class, and the bytes a delta (int32 indices + bf16 values,
zlib-compressed) would take against a full bf16 version — the case for sending versions as deltas (#43, item 5).

    .venv/bin/python benchmarks/bench_weight_deltas.py OLD/model.safetensors NEW/model.safetensors [--json F]

The versions are the learner's fp32 weights (a filesystem-transport run keeps the last two under
<run>/weights/<policy>/v<N>); each is cast to bf16 as a bf16 engine holds it.
"""

from __future__ import annotations

import argparse
import json
import zlib
from pathlib import Path

import torch
from safetensors.torch import load_file


def tensor_class(name: str) -> str:
    """embedding / attention / mlp / norm / head, from a transformers parameter name."""
    n = name.lower()
    if "embed" in n:
        return "embedding"
    if "lm_head" in n:
        return "head"
    if "norm" in n:
        return "norm"
    if any(k in n for k in ("q_proj", "k_proj", "v_proj", "o_proj", "attn")):
        return "attention"
    if any(k in n for k in ("mlp", "gate_proj", "up_proj", "down_proj")):
        return "mlp"
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    old, new = load_file(str(args.old)), load_file(str(args.new))
    classes: dict[str, dict[str, int]] = {}
    full_bytes = delta_raw = 0
    delta_parts = []
    for name, a in old.items():
        b = new[name]
        a16, b16 = a.to(torch.bfloat16).reshape(-1), b.to(torch.bfloat16).reshape(-1)
        changed = (a16.view(torch.int16) != b16.view(torch.int16)).nonzero().squeeze(-1)
        c = classes.setdefault(tensor_class(name), {"values": 0, "changed": 0})
        c["values"] += a16.numel()
        c["changed"] += changed.numel()
        full_bytes += a16.numel() * 2
        delta_raw += changed.numel() * 6
        delta_parts += [changed.to(torch.int32).numpy().tobytes(), b16[changed].view(torch.int16).numpy().tobytes()]
    compressed = len(zlib.compress(b"".join(delta_parts), 1))
    out = {"full_bf16_bytes": full_bytes, "delta_raw_bytes": delta_raw, "delta_zlib_bytes": compressed,
           "delta_share": compressed / full_bytes,
           "changed_by_class": {k: {**v, "share": v["changed"] / v["values"]} for k, v in sorted(classes.items())}}
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
