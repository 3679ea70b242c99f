"""Does one GRPO update move the policy as far in bf16 mixed precision as in fp32? (docs/algorithms.md §7.1)

The same batch of rollouts (sampled once, in fp32, from SmolLM2-135M-Instruct on the sums of
examples/real/smollm2.yaml) is turned into one update by each precision: token-mean GRPO loss on-policy, gradient
clipped to norm 1, a first AdamW step at lr 1e-5 (the state of a run's early steps). Each updated model is then read
on fixed greedy completions of held-out problems, through an fp32 forward and through a bf16-autocast forward (what
a bf16-mixed run's sampler and evaluation compute), and the shift of the per-token log-probs is reported against the
same view of the model before the update. Also: the cosine between the two precisions' gradients, and each view's
shift for an fp32-computed update applied to the fp32 master weights (the forward's rounding alone).

    .venv/bin/python benchmarks/bench_bf16_update.py [--lr 1e-5] [--updates 1] [--json FILE]

Needs a CPU with AVX-512 BF16/AMX (or a GPU): elsewhere bf16 is emulated and this takes an hour.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def rollouts(model, tok, style, task, verifier, prompts: int, group: int, max_new: int, seed: int):
    """``prompts`` training problems with mixed rewards, ``group`` fp32 samples each: token ids, advantages."""
    from mutualrl.models.generation import sample, text_decoder
    from mutualrl.models.policy import encode_prompt

    decode = text_decoder(tok)  # the text the run's worker scores
    g = torch.Generator().manual_seed(seed)
    ids, comps, advs = [], [], []
    for p in task.train:
        x = encode_prompt(tok, p.prompt, style)
        outs = sample(model, [x] * group, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                      max_new_tokens=max_new, temperature=1.0, generator=g)
        r = torch.tensor([verifier.score(p, decode(o.token_ids)) for o in outs])
        if r.std() == 0:
            continue  # no GRPO signal: contributes nothing to the update
        a = (r - r.mean()) / (r.std() + 1e-6)
        ids += [x] * group
        comps += [list(o.token_ids) for o in outs]
        advs += a.tolist()
        if len(ids) >= prompts * group:
            break
    return ids, comps, torch.tensor(advs)


def precision(name: str):
    """The project's resolved precision ``name`` on the CPU: its ``context`` is bf16 autocast or nothing."""
    from mutualrl.models.precision import resolve_precision

    return resolve_precision(name, pretrained=True, device="cpu")


def view(model, prompts, comps, pad_id: int, autocast: bool) -> torch.Tensor:
    """Per-token log-probs of fixed completions, flattened over their tokens, under fp32 or bf16 autocast."""
    from mutualrl.models.generation import sequence_logprobs

    with torch.no_grad(), precision("bf16-mixed" if autocast else "float32").context("cpu"):
        lp, mask = sequence_logprobs(model, prompts, comps, pad_id=pad_id)
    return lp[mask.bool()]


def update(model, prompts, comps, adv, pad_id: int, lr: float, bf16: bool, steps: int):
    """``steps`` GRPO updates on the same batch (on-policy ratio 1: the loss is −A·log π, token mean)."""
    from mutualrl.models.generation import sequence_logprobs

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    grads = None
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with precision("bf16-mixed" if bf16 else "float32").context("cpu"):
            lp, mask = sequence_logprobs(model, prompts, comps, pad_id=pad_id)
        loss = -(adv[:, None] * lp * mask).sum() / mask.sum()
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        if grads is None:
            grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]), norm
        opt.step()
    model.eval()
    return grads


def shift(before: torch.Tensor, after: torch.Tensor) -> dict:
    """How far the per-token log-probs moved: mean |Δ|, 99th percentile, and the mean Δ (the probe's tokens
    are the starting model's greedy choices: a drop is the policy moving away from them)."""
    d = after - before
    return {"mean_abs": float(d.abs().mean()), "p99_abs": float(torch.quantile(d.abs(), 0.99)),
            "mean": float(d.mean())}


def main() -> None:
    """Sample once, update once per precision, read each result through both views; print and keep JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--updates", type=int, default=1, help="AdamW steps on the same batch")
    ap.add_argument("--prompts", type=int, default=4, help="prompts with mixed rewards in the batch")
    ap.add_argument("--probe", type=int, default=32, help="held-out problems read before and after")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mutualrl.config import load_config
    from mutualrl.models.generation import sample
    from mutualrl.models.policy import encode_prompt
    from mutualrl.models.pretrained import get_model
    from mutualrl.runtime.policy_setup import build_task_from_config, prompt_style

    torch.manual_seed(args.seed)
    cfg = load_config(ROOT / "examples" / "real" / "smollm2.yaml")
    task, verifier = build_task_from_config(cfg)
    style = prompt_style(cfg, cfg.policies[0])
    path = str(get_model("smollm2-135m-instruct", echo=print))
    tok = AutoTokenizer.from_pretrained(path)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    t0 = time.perf_counter()
    ids, comps, adv = rollouts(base, tok, style, task, verifier, args.prompts, 8, cfg.budget.max_new_tokens, args.seed)
    probe_ids = [encode_prompt(tok, p.prompt, style) for p in task.eval[: args.probe]]
    greedy = sample(base, probe_ids, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                    max_new_tokens=cfg.budget.max_new_tokens, temperature=0.0)
    probe_comps = [list(o.token_ids) for o in greedy]
    before = {v: view(base, probe_ids, probe_comps, tok.pad_token_id, v == "bf16") for v in ("fp32", "bf16")}
    out: dict = {"model": "SmolLM2-135M-Instruct", "lr": args.lr, "updates": args.updates, "rows": len(ids),
                 "probe_tokens": int(before["fp32"].numel()), "threads": torch.get_num_threads(),
                 "views_before": shift(before["fp32"], before["bf16"]), "updates_by_precision": {}}
    print(f"{len(ids)} rows with mixed rewards, {out['probe_tokens']} probe tokens "
          f"({time.perf_counter() - t0:.0f} s); bf16 view vs fp32 view before any update: {out['views_before']}")
    grads = {}
    for prec in ("fp32", "bf16-mixed"):
        m = copy.deepcopy(base)
        g, norm = update(m, ids, comps, adv, tok.pad_token_id, args.lr, prec == "bf16-mixed", args.updates)
        grads[prec] = g
        row = {"grad_norm": norm}
        for v in ("fp32", "bf16"):
            row[f"shift_{v}_view"] = shift(before[v], view(m, probe_ids, probe_comps, tok.pad_token_id, v == "bf16"))
        out["updates_by_precision"][prec] = row
        print(prec, json.dumps(row), flush=True)
        del m
    a, b = grads["fp32"].double(), grads["bf16-mixed"].double()  # fp32 sums over 135 M entries drift past 1
    out["grad_cosine"] = float(torch.dot(a, b) / (a.norm() * b.norm()))
    out["sign_agreement"] = float((a.sign() == b.sign()).float().mean())
    print(f"gradient cosine fp32 vs bf16-mixed {out['grad_cosine']:.4f}, same sign {out['sign_agreement']:.4f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
