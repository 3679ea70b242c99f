"""Does a hint help a real receiver before any training? (The research version of ``mutualrl probe-hints``, whose
module, ``mutualrl.app.hint_probe``, does the sampling and counting for both: this script adds the conditions the
records in docs/results/real/sgt-r/ were measured under.) Samples a policy of an experiment file on its first N
training problems, plain and with SGT-R hints (each masked and framed as SGT-R frames it), and counts answers in the
required form and verified answers.

Two sources of hints:
- ``--peer NAME``: the peer policy of the same file samples each problem first; its shortest and its longest
  *verified* completion each become a hint, as SGT-R would receive them (any task). The probe then says how many of
  those hints still hold text other than the question once the answer is masked: a success that is only its answer
  carries nothing.
- without it, hints written here from the reference answers of two-term sums: a bare answer in the required form and
  a worked one (``12 + 34 = 46``), so the probe measures what the receiver does with a hint whatever a peer sends.

    .venv/bin/python tools/probe_hints.py examples/real/three-families.yaml gemma --format last_number --temperature 1
    .venv/bin/python tools/probe_hints.py examples/real/sharing/pair-b-ability.yaml gemma --peer smollm2 \\
        --set task.dataset=simple_equations --set 'task.dataset_config={max_value: 10}' --show all
    .venv/bin/python tools/probe_hints.py examples/real/sharing/pair-b-format.yaml smollm2 --response-prefix

``--response-prefix`` adds a condition with no hint at all: the receiver's completion starts with the required form's
opening (``<answer>``), as a response-prefix hint (BREAD's expert prefix) would start it. With ``--peer`` too, one more
per peer hint: the completion starts with the first ``--fraction`` of the peer's verified text before its answer (its
work, cut at a word), so the receiver writes the rest of the work and the answer itself.
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

import torch

from mutualrl.app.hint_probe import Sampler, Shown, form_opening, measure, peer_successes, work_prefix
from mutualrl.config import load_config
from mutualrl.tasks.answers import required_form
from mutualrl.tasks.hints import build_hint

WORK_PREFIX = "-work-prefix"
"""Suffix of the conditions whose peer text starts the receiver's completion instead of sitting in its prompt."""


def synthetic_peers(prompt: str, answer: str, fmt: str) -> dict[str, str]:
    """The peer texts of the synthetic mode (two-term sums only): a bare answer in the required form, a worked one."""
    a, b = [x.strip(" .") for x in prompt.replace("Calculate", "").split("+")]
    form = required_form(answer, fmt)
    return {"bare": form, "worked": f"{a} + {b} = {answer}" + ("" if form == answer else f"\n\n{form}")}


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("policy", help="the receiver")
    ap.add_argument("--peer", help="a policy of the same file whose verified samples become the hints")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="key.path=value (repeatable)")
    ap.add_argument("--format", help="task.answer_format (default: the file's, or as the data decides)")
    ap.add_argument("--show", default="all", choices=["all", "reasoning", "prefix"])
    ap.add_argument("--fraction", type=float, default=0.75,
                    help="share of the peer's text shown with --show prefix, and of its work before the answer that "
                         "starts the completion in the -work-prefix conditions")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--problems", type=int, default=6)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--response-prefix", action="store_true",
                    help="also sample with the required form's opening (e.g. <answer>) as the start of the receiver's "
                         "completion, no hint: whether a receiver that never opens the form finishes it when opened")
    ap.add_argument("--json", type=Path)
    return ap.parse_args()


def _conditions(args, hints: dict[str, list], fmt: str, verifier) -> dict:
    """Per hint kind, its text framed in the receiver's prompt (as SGT-R frames it); with --response-prefix, the
    form's opening and (with --peer) the peer's work each starting the receiver's completion instead."""
    def in_prompt(texts):
        def condition(i, p):
            if texts[i] is None:
                return None  # the peer had no success here: SGT-R would send nothing
            hint = build_hint(p.prompt, texts[i], show=args.show, fraction=args.fraction, answer_format=fmt,
                              gives_answer=lambda t, p=p: verifier.score(p, t) > 0, answer=p.answer)
            return Shown(hint.question, hint=hint.text)
        return condition

    def as_prefix(texts):
        def condition(i, p):
            if texts[i] is None:
                return None
            shown = work_prefix(texts[i], fmt, args.fraction, p.answer)
            return Shown(p.prompt, prefix=shown, hint=shown)
        return condition

    conditions = {}
    opening = form_opening(fmt) if args.response_prefix else ""
    if opening:
        conditions["form-prefix"] = lambda i, p: Shown(p.prompt, prefix=opening)
    conditions.update({kind: in_prompt(texts) for kind, texts in hints.items()})
    if args.peer and args.response_prefix:
        conditions.update({kind + WORK_PREFIX: as_prefix(texts) for kind, texts in hints.items()})
    return conditions


def main() -> None:
    """Sample the receiver plain and with each kind of hint; print (and keep as JSON) the rates."""
    args = _args()
    cfg = load_config(args.config, args.overrides)
    if args.format:
        cfg.task.answer_format = args.format
    from mutualrl.runtime.policy_setup import build_task_from_config

    task, verifier = build_task_from_config(cfg)
    fmt = cfg.task.answer_format  # resolved from the data when the file leaves it out
    names = [p.name for p in cfg.policies]
    g = torch.Generator().manual_seed(0)
    problems = task.train[: args.problems]
    out = {"config": str(args.config), "overrides": args.overrides, "policy": args.policy, "peer": args.peer,
           "format": fmt, "show": args.show, "temperature": args.temperature, "problems": len(problems),
           "samples": args.samples, "conditions": {}}

    if args.peer:
        peer = Sampler(cfg, names.index(args.peer), task, verifier, args.temperature, g)
        kept, verified = peer_successes(peer, problems, verifier, args.samples)
        del peer
        gc.collect()  # one model in memory at a time
        out["peer_verified"] = verified / (len(problems) * args.samples)
        print(f"{args.peer} T={args.temperature}: verified {verified}/{len(problems) * args.samples}, a success on "
              f"{sum(k is not None for k in kept)}/{len(problems)} problems", flush=True)
        hints = {"peer-shortest": [k and k[0] for k in kept], "peer-longest": [k and k[1] for k in kept]}
    else:
        hints = {kind: [synthetic_peers(p.prompt, p.answer, fmt)[kind] for p in problems]
                 for kind in ("bare", "worked")}
    receiver = Sampler(cfg, names.index(args.policy), task, verifier, args.temperature, g)
    rows = measure(receiver, problems, verifier, fmt, _conditions(args, hints, fmt, verifier), args.samples,
                   echo=lambda s: print(s.replace("[receiver]", f"{args.policy} T={args.temperature}"), flush=True))
    if "form-prefix" in rows:  # no hint in its prompt: not paired like the hint conditions
        for key in ("hints", "hints_with_work", "plain_verified_same_problems", "change"):
            rows["form-prefix"].pop(key, None)
    out["conditions"] = rows
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
