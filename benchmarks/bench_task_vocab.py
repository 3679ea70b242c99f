"""One GRPO step's compute for a tiny Qwen2 on the whole Qwen2.5 vocabulary against the same model
on Qwen2.5's tokenizer trimmed to the task's characters (``tokenizer.kind: qwen2.5-task``,
docs/algorithms.md §5.2): sampling a batch of 3-digit additions, then the log-probs of the samples
with their backward and an optimiser step, on one thread.

    .venv/bin/python benchmarks/bench_task_vocab.py [--rollouts 128] [--repeats 3]

Prints seconds per step for each, and the ratio whole / trimmed (what the trim buys).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from mutualrl.models.families import ModelShape
from mutualrl.models.generation import sample, sequence_logprobs
from mutualrl.models.policy import encode_prompt, load_policy
from mutualrl.tasks.arithmetic import ArithmeticTask


def step_seconds(kind: str, rollouts: int, repeats: int) -> dict:
    task = ArithmeticTask(min_digits=3, max_digits=3, operators="+")
    arts = load_policy(family="qwen2", shape=ModelShape(max_positions=64), tokenizer_kind=kind, corpus=task.corpus,
                       corpus_fingerprint=task.fingerprint())
    tok, model = arts.tokenizer, arts.model
    prompts = [encode_prompt(tok, p.prompt, False) for p in task.train[:rollouts]]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    times = {"sample": 0.0, "train": 0.0}
    for _ in range(repeats):
        t = time.perf_counter()
        samples = sample(model, prompts, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=6,
                         generator=gen)
        times["sample"] += time.perf_counter() - t
        t = time.perf_counter()
        lp, mask = sequence_logprobs(model, prompts, [s.token_ids or [tok.eos_token_id] for s in samples],
                                     pad_id=tok.pad_token_id)
        (-(lp * mask).sum() / mask.sum()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times["train"] += time.perf_counter() - t
    out = {k: v / repeats for k, v in times.items()}
    out.update(total=out["sample"] + out["train"], vocab=len(tok), params=arts.num_params)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    trimmed = step_seconds("qwen2.5-task", args.rollouts, args.repeats)
    whole = step_seconds("qwen2.5", args.rollouts, args.repeats)
    for name, r in (("qwen2.5 (whole)", whole), ("qwen2.5-task", trimmed)):
        print(f"{name:16s} vocab {r['vocab']:>7,}  params {r['params']:>11,}  sample {r['sample']:.2f} s  train "
              f"{r['train']:.2f} s  step {r['total']:.2f} s")
    print(json.dumps({"whole_over_trimmed": round(whole["total"] / trimmed["total"], 1)}))


if __name__ == "__main__":
    main()
