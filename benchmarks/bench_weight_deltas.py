"""How much of a bf16 engine's weights one learner step changes: the fraction of bf16 values that differ between
two consecutive published versions, per tensor class, and the bytes of the delta `weights.deltas` sends
(mutualrl.weights.deltas: per tensor, int32 gaps between changed positions as byte planes + bf16 values, zlib
level 1) against a whole bf16 version (#43, item 5; docs/algorithms.md §7.3), and the seconds to encode and to
rebuild it.

    .venv/bin/python benchmarks/bench_weight_deltas.py OLD/model.safetensors NEW/model.safetensors [--json F]
    .venv/bin/python benchmarks/bench_weight_deltas.py MODEL/model.safetensors --adam-step LR [--json F]

With ``--adam-step LR`` the new version is the old one after one AdamW step at LR with random gradients: AdamW's
first step moves every trained value by exactly LR (its bias-corrected m/sqrt(v) is the gradient's sign), the most
a step at that rate moves it, so the changed fraction is an upper bound for real steps at that rate.

The versions are the learner's fp32 weights (a filesystem-transport run keeps the last two under
<run>/weights/<policy>/v<N>); each is cast to bf16 as a bf16 engine holds it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from mutualrl.weights.deltas import apply_delta, bits, encode_delta


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


def adam_step(state: dict[str, torch.Tensor], lr: float, seed: int = 0) -> dict[str, torch.Tensor]:
    """``state`` (fp32 masters) after one AdamW step at ``lr`` (no weight decay) with random gradients."""
    params = {k: torch.nn.Parameter(v.float().clone()) for k, v in state.items()}
    g = torch.Generator().manual_seed(seed)
    for p in params.values():
        p.grad = torch.randn(p.shape, generator=g)
    torch.optim.AdamW(list(params.values()), lr=lr, weight_decay=0.0).step()
    return {k: p.detach() for k, p in params.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path, nargs="?")
    ap.add_argument("--adam-step", type=float, default=None, help="The new version: one AdamW step at this rate.")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    old = load_file(str(args.old))
    if args.adam_step is not None:
        new = adam_step(old, args.adam_step)
    elif args.new is not None:
        new = load_file(str(args.new))
    else:
        ap.error("give NEW or --adam-step LR")
    classes: dict[str, dict[str, int]] = {}
    full_bytes = delta_raw = delta_bytes = 0
    encode_s = rebuild_s = 0.0
    for name, a in old.items():
        a16, b16 = a.to(torch.bfloat16), new[name].to(torch.bfloat16)
        t0 = time.perf_counter()
        blob = encode_delta(b16, a16)
        encode_s += time.perf_counter() - t0
        changed = int((bits(a16) != bits(b16)).sum())
        c = classes.setdefault(tensor_class(name), {"values": 0, "changed": 0})
        c["values"] += a16.numel()
        c["changed"] += changed
        full_bytes += a16.numel() * 2
        delta_raw += changed * 6
        if blob is not None:
            delta_bytes += blob.numel()
            t0 = time.perf_counter()
            rebuilt = a16.clone()
            apply_delta(rebuilt, blob)
            rebuild_s += time.perf_counter() - t0
            assert torch.equal(bits(rebuilt), bits(b16)), name
    out = {"new": f"one AdamW step at lr {args.adam_step:g}" if args.adam_step is not None else str(args.new),
           "full_bf16_bytes": full_bytes, "delta_raw_bytes": delta_raw, "delta_bytes": delta_bytes,
           "delta_share": delta_bytes / full_bytes, "encode_s": encode_s, "rebuild_s": rebuild_s,
           "changed_by_class": {k: {**v, "share": v["changed"] / v["values"]} for k, v in sorted(classes.items())}}
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
