"""Where the hf engine's sampling time goes on a GPU: torch.profiler over our KV-cached loop and over
``model.generate`` on the same batch (SmolLM2-135M's shape, random weights, bf16), the top operators by
self CPU and self device time, and the wall time per token of each.

    bash: PYTHONPATH=... python benchmarks/gpu/profile_sampler.py [--rows 64] [--new 64]
(run through the device tool with the same PYTHONPATH as run_all.sh; on a CPU it runs tiny).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_all import build  # noqa: E402


class _B:  # the bits of run_all.Bench that build() reads
    def __init__(self, dry: bool):
        self.dry = dry
        self.device = "cuda" if torch.cuda.is_available() and not dry else "cpu"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    from torch.profiler import ProfilerActivity, profile

    from mutualrl.models.generation import sample

    b = _B(args.dry_run)
    dtype = torch.bfloat16 if b.device == "cuda" else torch.float32
    model = build("smollm2-135m", b, dtype).eval()
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, model.config.vocab_size, (args.rows, 128 if not b.dry else 8), generator=g)

    def ours():
        sample(model, prompts.tolist(), eos_id=-1, pad_id=2, max_new_tokens=args.new, temperature=1.0)

    def generate():
        with torch.no_grad():
            model.generate(input_ids=prompts.to(b.device), attention_mask=torch.ones_like(prompts).to(b.device),
                           do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.new,
                           min_new_tokens=args.new, pad_token_id=2)

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if b.device == "cuda" else [])
    for name, fn in (("ours", ours), ("generate", generate)):
        fn()  # warm-up
        if b.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if b.device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        per_token_ms, tok_s = 1e3 * wall / args.new, args.rows * args.new / wall
        print(f"### {name}: {wall:.3f} s, {per_token_ms:.2f} ms/token, {tok_s:.0f} tok/s")
        with profile(activities=acts) as prof:
            fn()
            if b.device == "cuda":
                torch.cuda.synchronize()
        key = "self_cuda_time_total" if b.device == "cuda" else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=14, max_name_column_width=40))
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=40))


if __name__ == "__main__":
    main()
