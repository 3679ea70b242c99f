"""Per-token log-probs at a production vocabulary: the full-vocabulary ``log_softmax`` + gather
against ``selective_logprobs`` (target logit minus a chunked logsumexp), forward + backward,
each in a fresh process so its peak memory (max RSS above the inputs) is its own.

    .venv/bin/python benchmarks/bench_logprobs.py [--rows 2048] [--vocab 151646] [--dtype bfloat16]

Prints time and peak extra memory of each and the ratios (goal: the selective path uses a
fraction of the memory, at no more time).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def _child(mode: str, rows: int, vocab: int, dtype: str) -> None:
    import torch

    from mutualrl.models.generation import selective_logprobs

    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    logits = torch.randn(rows, vocab, dtype=dt).requires_grad_(True)
    targets = torch.randint(0, vocab, (rows,))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    for _ in range(3):
        if mode == "full":
            lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[:, None]).squeeze(-1)
        else:
            lp = selective_logprobs(logits, targets)
        lp.sum().backward()
        logits.grad = None
    seconds = (time.perf_counter() - t) / 3
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    print(json.dumps({"seconds": seconds, "extra_mb": peak / 1024}))


def run(mode: str, rows: int, vocab: int, dtype: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--rows", str(rows), "--vocab", str(vocab),
                          "--dtype", dtype],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2048, help="positions (batch x completion tokens)")
    ap.add_argument("--vocab", type=int, default=151646)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--child", default=None)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.rows, args.vocab, args.dtype)
        return
    full = run("full", args.rows, args.vocab, args.dtype)
    sel = run("selective", args.rows, args.vocab, args.dtype)
    print(f"{args.rows} positions x {args.vocab} vocabulary, {args.dtype} logits, forward + backward (mean of 3)")
    print(f"full log_softmax + gather : {full['seconds'] * 1000:8.0f} ms  peak +{full['extra_mb']:7.0f} MB")
    print(f"selective (chunked lse)   : {sel['seconds'] * 1000:8.0f} ms  peak +{sel['extra_mb']:7.0f} MB")
    print(f"memory ratio selective/full: {sel['extra_mb'] / max(full['extra_mb'], 1):.2f}; time ratio: "
          f"{sel['seconds'] / full['seconds']:.2f}")


if __name__ == "__main__":
    main()
