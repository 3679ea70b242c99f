"""Does a hint help a real receiver before any training? Samples a policy of an experiment file on the first N
training problems of two-term sums, plain and with SGT-R hints (a peer's bare answer, a peer's worked answer; each
masked and framed as SGT-R frames it), and counts answers in the required form and verified answers.

    .venv/bin/python tools/probe_hints.py examples/real/three-families.yaml gemma --format last_number --temperature 1

The peer texts are written here from the reference answers ("12 + 34 = 46", and the form alone), so the probe
measures what the receiver does with a hint, whatever any peer would have sent."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from mutualrl.config import load_config
from mutualrl.models.cache import default_cache_dir
from mutualrl.models.generation import cut_at_stop, sample, text_decoder
from mutualrl.models.policy import encode_prompt
from mutualrl.runtime.policy_setup import build_task_from_config, prepare_policy, prompt_style
from mutualrl.tasks.answers import extract_answer, required_form
from mutualrl.tasks.hints import build_hint


def peers(prompt: str, answer: str, fmt: str) -> dict[str, str]:
    """The peer texts a receiver is shown (before masking): a bare answer in the required form, a worked one."""
    a, b = [x.strip(" .") for x in prompt.replace("Calculate", "").split("+")]
    form = required_form(answer, fmt)
    return {"bare": form, "worked": f"{a} + {b} = {answer}" + ("" if form == answer else f"\n\n{form}")}


def main() -> None:
    """Sample the policy plain and with each kind of hint; print (and keep as JSON) the rates."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("policy")
    ap.add_argument("--format", default="last_number")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--problems", type=int, default=6)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cfg = load_config(args.config)
    cfg.task.answer_format = args.format
    task, verifier = build_task_from_config(cfg)
    index = [p.name for p in cfg.policies].index(args.policy)
    pp = prepare_policy(cfg, index, task, verifier, default_cache_dir(), lambda s: None)
    tok, model, style = pp.arts.tokenizer, pp.arts.model, prompt_style(cfg, pp.config)
    stops = style.stops(tok)

    dec = text_decoder(tok)

    def text(o) -> str:
        return cut_at_stop(dec, o, stops)[1] if stops else dec(o.token_ids)

    g = torch.Generator().manual_seed(0)
    problems = task.train[: args.problems]
    out = {"config": str(args.config), "policy": args.policy, "format": args.format,
           "temperature": args.temperature, "problems": len(problems), "samples": args.samples, "conditions": {}}
    for kind in ("plain", "bare", "worked"):
        form = verified = 0
        example = None
        for p in problems:
            hint = None if kind == "plain" else build_hint(
                p.prompt, peers(p.prompt, p.answer, args.format)[kind], show="all", fraction=1.0,
                answer_format=args.format, gives_answer=lambda t, p=p: verifier.score(p, t) > 0, answer=p.answer)
            ids = encode_prompt(tok, hint.question if hint else p.prompt, style)
            texts = [text(o) for o in sample(model, [ids] * args.samples, eos_id=tok.eos_token_id,
                                             pad_id=tok.pad_token_id, max_new_tokens=cfg.budget.max_new_tokens,
                                             temperature=args.temperature, generator=g)]
            form += sum(extract_answer(t, args.format) is not None for t in texts)
            verified += sum(verifier.score(p, t) > 0 for t in texts)
            example = example or {"hint": hint.text if hint else None, "samples": texts[:3]}
        n = len(problems) * args.samples
        out["conditions"][kind] = {"in_form": form / n, "verified": verified / n, "n": n, "example": example}
        print(f"{args.policy} T={args.temperature} {kind:6s}: in form {form}/{n}, verified {verified}/{n}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
