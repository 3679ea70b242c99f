"""How far apart the sampler's and the learner's log-probs are under each precision, on a real model
(docs/algorithms.md §7.1): per token |log π_learner − log π_sampler| on the sampled tokens, mean and 99th
percentile, before any update — what the behaviour correction corrects.

Pairs measured (the learner always computes one full forward over prompt + completion, the sampler its
KV-cached loop):
- fp32 sampler, fp32 learner (the float-rounding floor);
- the learner's own fp32 module sampled under bf16 autocast (``mutualrl run``, shared), learner under bf16
  autocast;
- a private bf16 copy of the weights (``mutualrl up``'s engine), learner under bf16 autocast.

    .venv/bin/python benchmarks/bench_bf16_gap.py [--model smollm2-135m-instruct] [--rows 4] [--tokens 24]

On a CPU without AVX-512 BF16 the bf16 matmuls are emulated (~100x slower than fp32): keep it small there.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def gap(a: torch.Tensor, b: torch.Tensor) -> dict:
    d = (a - b).abs()
    return {"mean": float(d.mean()), "p99": float(torch.quantile(d, 0.99)), "max": float(d.max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import copy

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mutualrl.models.generation import sample, sequence_logprobs
    from mutualrl.models.policy import PromptStyle, encode_prompt
    from mutualrl.models.precision import resolve_precision
    from mutualrl.models.pretrained import get_model
    from mutualrl.tasks import build_task

    path = str(get_model(args.model, echo=print))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(args.device).eval()
    task = build_task("arithmetic", seed=0, min_digits=1, max_digits=2, train_size=64, eval_size=8)
    style = PromptStyle(instruction="Give the answer as a number.")
    prompts = [encode_prompt(tok, p.prompt, style) for p in task.train[: args.rows]]
    bf16 = resolve_precision("bf16-mixed", pretrained=True, device=args.device)
    bf16_copy = copy.deepcopy(model).to(torch.bfloat16)
    samplers = {"fp32": (model, torch.float32), "bf16_autocast_shared": (model, "autocast"),
                "bf16_copy": (bf16_copy, None)}
    out: dict = {"model": args.model, "rows": args.rows, "max_new_tokens": args.tokens, "device": args.device}
    for name, (m, how) in samplers.items():
        t0 = time.perf_counter()
        torch.manual_seed(0)
        ctx = bf16.context(args.device) if how == "autocast" else torch.autocast(args.device, enabled=False)
        with ctx:
            s = sample(m, prompts, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=args.tokens)
        comps = [x.token_ids for x in s]
        behaviour = torch.tensor([lp for x in s for lp in x.logprobs])
        learner_ctx = bf16.context(args.device) if name != "fp32" else torch.autocast(args.device, enabled=False)
        with torch.no_grad(), learner_ctx:
            lp, mask = sequence_logprobs(model, prompts, comps, pad_id=tok.pad_token_id)
        learner = lp[mask > 0].float().cpu()
        out[name] = {**gap(learner, behaviour), "tokens": int(behaviour.numel()),
                     "seconds": time.perf_counter() - t0}
        print(name, json.dumps(out[name]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
