"""Does a hint help a real receiver before any training? Samples a policy of an experiment file on its first N
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
import re
from pathlib import Path

import torch

from mutualrl.config import load_config
from mutualrl.models.cache import default_cache_dir
from mutualrl.models.generation import cut_at_stop, sample, stop_string_check, text_decoder
from mutualrl.models.policy import encode_prompt
from mutualrl.runtime.policy_setup import build_task_from_config, prepare_policy, prompt_style
from mutualrl.tasks.answers import MASK, answer_span, extract_answer, required_form
from mutualrl.tasks.hints import build_hint


def synthetic_peers(prompt: str, answer: str, fmt: str) -> dict[str, str]:
    """The peer texts of the synthetic mode (two-term sums only): a bare answer in the required form, a worked one."""
    a, b = [x.strip(" .") for x in prompt.replace("Calculate", "").split("+")]
    form = required_form(answer, fmt)
    return {"bare": form, "worked": f"{a} + {b} = {answer}" + ("" if form == answer else f"\n\n{form}")}


def carries_work(hint_text: str, question: str) -> bool:
    """Whether a masked hint holds a number that is neither in the question nor the mask: an intermediate result,
    the only thing a masked success can pass on that the receiver did not already have."""
    asked = set(re.findall(r"\d+", question))
    return any(n not in asked for n in re.findall(r"\d+", hint_text.replace(MASK, " ")))


class Sampler:
    """One policy of the experiment, loaded, sampling ``k`` completions of a question at the given temperature."""

    def __init__(self, cfg, index: int, task, verifier, temperature: float, generator: torch.Generator):
        pp = prepare_policy(cfg, index, task, verifier, default_cache_dir(), lambda s: None)
        self.tok, self.model, self.style = pp.arts.tokenizer, pp.arts.model, prompt_style(cfg, pp.config)
        self.stops = self.style.stops(self.tok)
        self.decode = text_decoder(self.tok)
        self.check = stop_string_check(self.decode, self.stops)
        self.max_new_tokens, self.temperature, self.generator = cfg.budget.max_new_tokens, temperature, generator

    def __call__(self, question: str, k: int, prefix: str = "") -> list[str]:
        """``k`` sampled completions of ``question`` in the policy's prompt style, each cut at its stop strings;
        with ``prefix``, each completion starts with it (a response prefix, not sampled), included in the text."""
        ids = encode_prompt(self.tok, question, self.style)
        if prefix:
            ids = ids + self.tok(prefix, add_special_tokens=False)["input_ids"]
        outs = sample(self.model, [ids] * k, eos_id=self.tok.eos_token_id, pad_id=self.tok.pad_token_id,
                      max_new_tokens=self.max_new_tokens, temperature=self.temperature, generator=self.generator,
                      stop=self.check)
        return [prefix + (cut_at_stop(self.decode, o, self.stops)[1] if self.stops else self.decode(o.token_ids))
                for o in outs]


UNHINTED = ("plain", "form-prefix")
"""The conditions with no hint in the prompt."""
WORK_PREFIX = "-work-prefix"
"""Suffix of the conditions whose peer text starts the receiver's completion instead of sitting in its prompt."""


def work_prefix(text: str, fmt: str, fraction: float) -> str:
    """The first ``fraction`` of a peer success's text before its answer (the form's opening included at 1.0), cut
    back to a word boundary: what a response-prefix hint hands the receiver to continue. "" when the text gives no
    answer or the share holds no whole word."""
    span = answer_span(text, fmt)
    if span is None:
        return ""
    before = text[: span[0]]
    if fraction >= 1:
        return before
    cut = before[: int(len(before) * fraction)]
    return cut[: cut.rfind(" ") + 1] if " " in cut else ""


def form_opening(fmt: str) -> str:
    """The text the required form puts before the answer (``<answer>``, ``\\boxed{``; empty for bare numbers), where
    the task's own parser finds the answer in it: the response prefix of ``--response-prefix``."""
    form = required_form("46", fmt)
    return form[: answer_span(form, fmt)[0]]


def peer_hints(cfg, index: int, task, verifier, problems, args, g: torch.Generator, out: dict) -> dict[str, list]:
    """The peer samples each problem; its verified samples per problem are the hints (None: no success, so SGT-R
    would send nothing): the shortest (what SGT's ``select: shortest`` keeps) and the longest (the likeliest to show
    work that masking leaves in). Its verified rate goes into ``out``."""
    peer = Sampler(cfg, index, task, verifier, args.temperature, g)
    verified, kept = 0, []
    for p in problems:
        ok = [t for t in peer(p.prompt, args.samples) if verifier.score(p, t) > 0]
        verified += len(ok)
        kept.append((min(ok, key=len), max(ok, key=len)) if ok else None)
    out["peer_verified"] = verified / (len(problems) * args.samples)
    print(f"{args.peer} T={args.temperature}: verified {verified}/{len(problems) * args.samples}, a success on "
          f"{sum(k is not None for k in kept)}/{len(problems)} problems", flush=True)
    del peer
    gc.collect()
    return {"peer-shortest": [k and k[0] for k in kept], "peer-longest": [k and k[1] for k in kept]}


def main() -> None:
    """Sample the receiver plain and with each kind of hint; print (and keep as JSON) the rates."""
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
    args = ap.parse_args()
    cfg = load_config(args.config, args.overrides)
    if args.format:
        cfg.task.answer_format = args.format
    task, verifier = build_task_from_config(cfg)
    fmt = cfg.task.answer_format  # resolved from the data when the file leaves it out
    names = [p.name for p in cfg.policies]
    g = torch.Generator().manual_seed(0)
    problems = task.train[: args.problems]
    out = {"config": str(args.config), "overrides": args.overrides, "policy": args.policy, "peer": args.peer,
           "format": fmt, "show": args.show, "temperature": args.temperature, "problems": len(problems),
           "samples": args.samples, "conditions": {}}

    hints = (peer_hints(cfg, names.index(args.peer), task, verifier, problems, args, g, out) if args.peer else
             {kind: [synthetic_peers(p.prompt, p.answer, fmt)[kind] for p in problems] for kind in ("bare", "worked")})
    receiver = Sampler(cfg, names.index(args.policy), task, verifier, args.temperature, g)
    plain_ok: list[int] = []
    opening = form_opening(fmt) if args.response_prefix else ""
    if args.peer and args.response_prefix:
        hints.update({kind + WORK_PREFIX: list(texts) for kind, texts in list(hints.items())})
    kinds = ("plain", *(["form-prefix"] if opening else []), *hints)
    for kind in kinds:
        form = verified = n = work = used = same = 0
        examples = []
        for i, p in enumerate(problems):
            hint, prefix = None, opening if kind == "form-prefix" else ""
            if kind not in UNHINTED:
                if hints[kind][i] is None:
                    continue  # the peer had no success here: SGT-R would send nothing
                if kind.endswith(WORK_PREFIX):  # the peer's work starts the completion
                    prefix = shown = work_prefix(hints[kind][i], fmt, args.fraction)
                else:  # the peer's text sits in the prompt, masked and framed
                    hint = build_hint(p.prompt, hints[kind][i], show=args.show, fraction=args.fraction,
                                      answer_format=fmt, gives_answer=lambda t, p=p: verifier.score(p, t) > 0,
                                      answer=p.answer)
                    shown = hint.text
                used += 1
                work += carries_work(shown, p.prompt)
                same += plain_ok[i]
            texts = receiver(hint.question if hint else p.prompt, args.samples, prefix=prefix)
            form += sum(extract_answer(t, fmt) is not None for t in texts)
            ok = sum(verifier.score(p, t) > 0 for t in texts)
            if kind == "plain":
                plain_ok.append(ok)
            verified += ok
            n += len(texts)
            if len(examples) < 3:
                examples.append({"question": p.prompt, "answer": p.answer,
                                 "hint": hint.text if hint else (prefix or None),
                                 "verified": ok, "samples": texts[:2]})
        row = {"in_form": form / max(n, 1), "verified": verified / max(n, 1), "n": n, "examples": examples}
        extra = ""
        if kind not in UNHINTED:
            # the plain rate on the same problems: a peer succeeds where the problem is easy, so the plain rate over
            # all problems would flatter the hint
            row.update(hints=used, hints_with_work=work, plain_verified_same_problems=same / max(n, 1))
            extra = f", plain on the same problems {same}/{n}; hints {used} (with work beyond the question: {work})"
        out["conditions"][kind] = row
        print(f"{args.policy} T={args.temperature} {kind:6s}: in form {form}/{n}, verified {verified}/{n}{extra}",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
