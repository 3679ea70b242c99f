"""Ending a completion-form policy's rows at their stop strings against generating to max_new_tokens and cutting
afterwards (the baseline, what the hf engine and evaluation did), in the same process on the same prompts.

    .venv/bin/python benchmarks/bench_stop_strings.py [--config examples/real/sharing/pair-b-ability.yaml]
        [--policy gemma] [--problems 64] [--json out.json]

A base model prompted "Question: … Answer:" answers in a few tokens and then writes the next question, which the
worker cuts. Prints the seconds of greedy evaluation and of one sampled group step each way, the ratio, and
whether the cut texts agree (greedy: they must; sampled: up to the float rounding of a smaller batch).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/real/sharing/pair-b-ability.yaml")
    ap.add_argument("--policy", default="gemma")
    ap.add_argument("--problems", type=int, default=64)
    ap.add_argument("--group", type=int, default=8, help="samples per prompt of the sampled step (4 prompts)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from mutualrl.config import load_config
    from mutualrl.models.cache import default_cache_dir
    from mutualrl.models.generation import cut_at_stop, sample, stop_string_check, text_decoder
    from mutualrl.models.policy import encode_prompt
    from mutualrl.runtime.policy_setup import build_task_from_config, prepare_policy, prompt_style

    cfg = load_config(Path(args.config))
    index = next(i for i, q in enumerate(cfg.policies) if q.name == args.policy)
    p = cfg.policies[index]
    task, verifier = build_task_from_config(cfg)
    pp = prepare_policy(cfg, index, task, verifier, default_cache_dir())
    model, tok = pp.arts.model.eval(), pp.arts.tokenizer
    style = prompt_style(cfg, p)
    stops = style.stops(tok) if style is not None else ()
    if not stops:
        raise SystemExit(f"{args.policy} has no stop strings (not a completion-form policy): nothing to measure")

    decode = text_decoder(tok)

    def run(prompts: list[list[int]], temperature: float, early: bool) -> tuple[float, list[str], int]:
        t0 = time.perf_counter()
        outs = sample(model, prompts, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                      max_new_tokens=cfg.budget.max_new_tokens, temperature=temperature,
                      generator=torch.Generator().manual_seed(0),
                      stop=stop_string_check(decode, stops) if early else None)
        seconds = time.perf_counter() - t0
        cut = [cut_at_stop(decode, s, stops) for s in outs]
        return seconds, [c[1] for c in cut], sum(len(s.token_ids) for s in outs)

    evals = [encode_prompt(tok, q.prompt, style) for q in task.eval[: args.problems]]
    group = [encode_prompt(tok, q.prompt, style) for q in task.train[:4] for _ in range(args.group)]
    out: dict = {"config": args.config, "policy": args.policy, "stops": list(stops),
                 "max_new_tokens": cfg.budget.max_new_tokens, "threads": torch.get_num_threads()}
    for name, prompts, temperature in (("greedy_eval", evals, 0.0), ("sampled_step", group, p.engine.temperature)):
        base_s, base_texts, base_tokens = run(prompts, temperature, early=False)
        stop_s, stop_texts, stop_tokens = run(prompts, temperature, early=True)
        same = sum(a == b for a, b in zip(base_texts, stop_texts))
        out[name] = {"rows": len(prompts), "baseline_s": round(base_s, 2), "stop_s": round(stop_s, 2),
                     "speedup": round(base_s / stop_s, 2), "baseline_tokens": base_tokens,
                     "stop_tokens": stop_tokens, "same_texts": f"{same}/{len(prompts)}"}
        print(name, json.dumps(out[name]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
