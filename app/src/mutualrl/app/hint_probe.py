"""``mutualrl probe-hints``: before seeds are spent on SGT-R, does a peer's verified success, shown to a receiver the
way SGT-R shows it, make the receiver verify more often than it does without it, on the same problems?

SGT-R (docs/algorithms.md §3.5) learns only from the rescue samples that verify. Where a hint does not raise the
receiver's verified rate, its rescue round is k more plain samples with extra prompt text (its resample-only control)
and nothing is gained from the peer. That was the finding of every cold-start pair probed for issue #44: a masked
sum or product leaves a 135–270 M receiver the arithmetic it lacks, and a receiver asked for a form it never writes
took up the form and lost the skill (docs/results/real/sgt-r/README.md). A run of a real pair costs an hour on a CPU;
this probe costs minutes and answers the question first.

What it does, on the first ``problems`` training problems:

1. The peer samples each problem ``samples`` times at its temperature; its verified completions are what SGT-R would
   receive. Its shortest and its longest success per problem each become a hint: cut as ``sharing.sgt_r.show`` says
   (at step 1's share), the answer masked where the receiver's verifier would read it, framed by the fixed hint
   template, and refused for the reasons SGT-R refuses one (``hint_refusal``: the frame's delimiters, a control
   token, text the receiver cannot spell, too long), counted by reason.
2. The receiver samples every problem plainly, and each hinted question, ``samples`` times at its temperature.
3. Per hint kind, the paired difference per problem — the hinted verified share minus the plain one *on the same
   problems* (a peer succeeds where a problem is easy, so the plain rate over all problems would flatter the hint) —
   with its 95 % interval over the problems, and the verdict: the hint **raises** the rate (the interval above 0),
   **lowers** it (below 0), or makes **no measurable change**. It also says how many masked hints still hold a number
   beyond the question (an intermediate result: the only thing a masked success can pass on that the receiver did not
   have), how many samples write the right answer anywhere, verified or not (a step done and then spoilt by a
   ramble, told apart from a step never done), and, with ``reference``, the same for the task's own answer as the
   hint (SGT-R's reference control).

The policies are loaded one at a time, so memory is that of the larger one.
"""

from __future__ import annotations

import gc
import re
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

import torch

from mutualrl.config import ConfigError, ExperimentConfig
from mutualrl.config.schema import SgtRConfig
from mutualrl.models.generation import sample, stop_string_check, text_decoder
from mutualrl.models.policy import encode_prompt
from mutualrl.runtime.compare_stats import ci95
from mutualrl.runtime.evaluation import completion_text
from mutualrl.runtime.policy_setup import build_task_from_config, prepare_policy, prompt_style, sampling_temperature
from mutualrl.services.learner.hinted_rescue import hint_refusal
from mutualrl.tasks import Problem, Verifier
from mutualrl.tasks.answers import MASK, answer_span, extract_answer, required_form, standalone_answer
from mutualrl.tasks.hints import Hint, build_hint, reference_hint

PLAIN = "plain"
"""The condition every other is paired with: the problem as the receiver is always shown it."""
HINT_KINDS = ("peer-shortest", "peer-longest")
"""The peer's successes a probe turns into hints: the shortest (little but the answer, on short tasks) and the
longest (the likeliest to show work that the mask leaves in)."""


@dataclass
class Shown:
    """What the receiver is given in one condition for one problem: the question in its prompt (the problem, or the
    hint's frame around it), text its completion starts with (a response prefix, not sampled), and the hint's own
    text (for the work count and the examples)."""

    question: str
    prefix: str = ""
    hint: Optional[str] = None


Condition = Callable[[int, Problem], Optional[Shown]]
"""``condition(i, problem)``: what the receiver is shown on the i-th problem, or None (nothing to show there: the peer
had no success, or its hint was refused)."""


class Sampler:
    """One policy of the experiment, loaded, sampling ``k`` completions of a question at ``temperature`` in its own
    prompt style, each cut at its stop strings as its verifier reads it."""

    def __init__(self, cfg: ExperimentConfig, index: int, task, verifier: Verifier, temperature: float,
                 generator: torch.Generator, cache=None, echo: Callable[[str], None] = lambda s: None):
        from mutualrl.models.cache import default_cache_dir

        pp = prepare_policy(cfg, index, task, verifier, cache or default_cache_dir(), echo)
        self.tok, self.model, self.style = pp.arts.tokenizer, pp.arts.model, prompt_style(cfg, pp.config)
        self.check = stop_string_check(text_decoder(self.tok), self.style.stops(self.tok))
        self.max_new_tokens, self.temperature, self.generator = cfg.budget.max_new_tokens, temperature, generator

    def __call__(self, question: str, k: int, prefix: str = "") -> list[str]:
        """``k`` sampled completions of ``question``; with ``prefix``, each starts with it (included in the text)."""
        ids = encode_prompt(self.tok, question, self.style)
        if prefix:
            ids = ids + self.tok(prefix, add_special_tokens=False)["input_ids"]
        outs = sample(self.model, [ids] * k, eos_id=self.tok.eos_token_id, pad_id=self.tok.pad_token_id,
                      max_new_tokens=self.max_new_tokens, temperature=self.temperature, generator=self.generator,
                      stop=self.check)
        return [prefix + completion_text(self.tok, o, self.style) for o in outs]


def answer_at(text: str, answer: str) -> Optional[int]:
    """Where ``text`` first writes the reference ``answer`` standing alone (:func:`standalone_answer`), a
    non-negative answer not as the tail of a negative (``5`` is not written by ``-5``); None where it never does."""
    if not answer.strip():
        return None
    signed = answer.strip().startswith("-")
    for found in standalone_answer(answer).finditer(text):
        if signed or not text[: found.start()].endswith("-"):
            return found.start()
    return None


def writes_answer(text: str, answer: str) -> bool:
    """Whether a completion writes the reference ``answer`` anywhere, verified or not (:func:`answer_at`). Where a
    completion writes it and does not verify, the receiver did the arithmetic and spoilt its ending (a ramble after
    it, another number last); where it never writes it, the step was not done. A diagnostic, not a score: a ramble
    of numbers can hit it by chance."""
    return answer_at(text, answer) is not None


def carries_work(hint_text: str, question: str) -> bool:
    """Whether a masked hint holds a number that is neither in the question nor the mask: an intermediate result."""
    asked = set(re.findall(r"\d+", question))
    return any(n not in asked for n in re.findall(r"\d+", hint_text.replace(MASK, " ")))


def work_prefix(text: str, fmt: str, fraction: float, answer: Optional[str] = None) -> str:
    """The first ``fraction`` of a peer success's text before its answer (the form's opening included at 1.0), cut
    back to a word boundary: what a response-prefix hint hands the receiver to continue. With the reference
    ``answer``, "before its answer" is before the first place the text writes it: a worked success writes its result
    (``91 + 88 = 179``) before its final answer, and a prefix that held it would hand the answer over. "" when the
    text gives no answer or the share holds no whole word."""
    span = answer_span(text, fmt)
    if span is None:
        return ""
    first = answer_at(text, answer) if answer is not None else None
    before = text[: min(span[0], first) if first is not None else span[0]]
    if fraction >= 1:
        return before
    cut = before[: int(len(before) * fraction)]
    return cut[: cut.rfind(" ") + 1] if " " in cut else ""


def form_opening(fmt: str) -> str:
    """The text the required form puts before the answer (``<answer>``, ``\\boxed{``; empty for bare numbers)."""
    form = required_form("46", fmt)
    return form[: answer_span(form, fmt)[0]]


def peer_successes(peer: Sampler, problems: list[Problem], verifier: Verifier, k: int,
                   echo: Callable[[str], None] = lambda s: None) -> tuple[list[Optional[tuple[str, str]]], int]:
    """Per problem, the peer's shortest and longest verified completion of ``k`` (None: no success, so SGT-R would
    get nothing there), and how many of all its samples verified. A line per problem through ``echo``: a larger
    peer takes minutes a problem on a CPU."""
    kept: list[Optional[tuple[str, str]]] = []
    verified = 0
    for i, p in enumerate(problems, 1):
        ok = [t for t in peer(p.prompt, k) if verifier.score(p, t) > 0]
        verified += len(ok)
        kept.append((min(ok, key=len), max(ok, key=len)) if ok else None)
        echo(f"[peer] problem {i}/{len(problems)}: verified {len(ok)}/{k} (so far {verified}/{i * k})")
    return kept, verified


def paired_change(hinted: list[Optional[int]], plain: list[int], k: int) -> dict:
    """The hinted against the plain verified share on the problems that had a hint: the mean and 95 % interval of
    the per-problem difference (in points), the problems counted, and the verdict ``raises`` / ``lowers`` /
    ``no measurable change`` (``no hint`` where none was shown; ``one problem`` where there is no interval)."""
    diffs = [100.0 * (h - p) / k for h, p in zip(hinted, plain) if h is not None]
    if not diffs:
        return {"mean": None, "ci95": None, "problems": 0, "verdict": "no hint"}
    stats = ci95(diffs)
    half = stats["ci95"]
    if half is None:
        verdict = "one problem"
    elif stats["mean"] - half > 0:
        verdict = "raises"
    elif stats["mean"] + half < 0:
        verdict = "lowers"
    else:
        verdict = "no measurable change"
    return {"mean": stats["mean"], "ci95": half, "problems": len(diffs), "verdict": verdict}


def measure(receiver: Callable[..., list[str]], problems: list[Problem], verifier: Verifier, fmt: str,
            conditions: dict[str, Condition], k: int, echo: Callable[[str], None] = lambda s: None) -> dict[str, dict]:
    """Sample the receiver ``k`` times per problem plainly and under each condition; per condition: completions in
    the required form, verified, and writing the answer anywhere (:func:`writes_answer`, the response prefix left
    out), the hints shown and those holding work, the plain rate on the same problems, the paired change
    (:func:`paired_change`) and up to three examples."""
    rows: dict[str, dict] = {}
    plain_ok: list[int] = []
    for name, condition in {PLAIN: lambda i, p: Shown(p.prompt), **conditions}.items():
        in_form = n = work = written = 0
        by_problem: list[Optional[int]] = []
        examples: list[dict] = []
        for i, p in enumerate(problems):
            shown = condition(i, p)
            if shown is None:
                by_problem.append(None)
                continue
            texts = receiver(shown.question, k, prefix=shown.prefix)
            ok = sum(verifier.score(p, t) > 0 for t in texts)
            by_problem.append(ok)
            in_form += sum(extract_answer(t, fmt) is not None for t in texts)
            written += sum(writes_answer(t[len(shown.prefix):], p.answer) for t in texts)
            n += len(texts)
            if shown.hint is not None:
                work += carries_work(shown.hint, p.prompt)
            if len(examples) < 3:
                examples.append({"question": p.prompt, "answer": p.answer, "hint": shown.hint,
                                 "prefix": shown.prefix or None, "verified": ok, "samples": texts[:2]})
        if name == PLAIN:
            plain_ok = [b or 0 for b in by_problem]
        verified = sum(b for b in by_problem if b is not None)
        same = sum(pl for b, pl in zip(by_problem, plain_ok) if b is not None)
        row = {"n": n, "in_form": in_form / max(n, 1), "verified": verified / max(n, 1), "verified_count": verified,
               "written": written, "by_problem": by_problem, "examples": examples}
        if name != PLAIN:
            row.update(hints=sum(b is not None for b in by_problem), hints_with_work=work,
                       plain_verified_same_problems=same / max(n, 1), change=paired_change(by_problem, plain_ok, k))
        rows[name] = row
        extra = (f", plain on the same problems {same}/{n}: {_change_text(row['change'])}" if name != PLAIN else "")
        echo(f"[receiver] {name:14s} in form {in_form}/{n}, verified {verified}/{n}, answer written {written}/{n}"
             f"{extra}")
    return rows


def _change_text(change: dict) -> str:
    if change["mean"] is None:
        return change["verdict"]
    ci = f" ± {change['ci95']:.1f}" if change["ci95"] is not None else ""
    return f"{change['mean']:+.1f}{ci} points per problem ({change['verdict']})"


class SgtRHints:
    """The hint conditions of a probe, built as SGT-R builds a hint (``build_hint`` at step 1's share, the answer
    masked where the verifier would read it) and refused where SGT-R would refuse it (``hint_refusal``)."""

    def __init__(self, tok, kept: list[Optional[tuple[str, str]]], verifier: Verifier, fmt: str, sgt_r: SgtRConfig):
        self.tok, self.kept, self.verifier, self.fmt, self.sgt_r = tok, kept, verifier, fmt, sgt_r

    def _peer_hint(self, which: int, i: int, p: Problem) -> Optional[Hint]:
        if self.kept[i] is None:
            return None  # the peer had no success here: SGT-R would get nothing
        return build_hint(p.prompt, self.kept[i][which], show=self.sgt_r.show, fraction=self.sgt_r.prefix_start,
                          answer_format=self.fmt, gives_answer=lambda t: self.verifier.score(p, t) > 0,
                          answer=p.answer)

    def conditions(self, reference: bool) -> dict[str, "Screened"]:
        """The peer's shortest and longest success as hints, and with ``reference`` the task's answer."""
        out = {kind: Screened(self.tok, self.sgt_r.max_hint_tokens, partial(self._peer_hint, which))
               for which, kind in enumerate(HINT_KINDS)}
        if reference:
            out["reference"] = Screened(self.tok, self.sgt_r.max_hint_tokens,
                                        lambda i, p: reference_hint(p.prompt, p.answer))
        return out


class Screened:
    """A hint condition: the hint of ``make`` for a problem, shown unless SGT-R would refuse it; the refusals (by
    reason) and the masked hints are counted."""

    def __init__(self, tok, max_hint_tokens: int, make: Callable[[int, Problem], Optional[Hint]]):
        self.tok, self.max_hint_tokens, self.make = tok, max_hint_tokens, make
        self.refused: Counter = Counter()
        self.masked = 0

    def __call__(self, i: int, p: Problem) -> Optional[Shown]:
        """What the receiver is shown on the i-th problem, or None (no hint, or a refused one)."""
        hint = self.make(i, p)
        if hint is None:
            return None
        reason = hint_refusal(self.tok, hint.text, self.max_hint_tokens)
        if reason is not None:
            self.refused[reason] += 1
            return None
        self.masked += hint.masked
        return Shown(hint.question, hint=hint.text)


def probe_hints(cfg: ExperimentConfig, receiver: str, peer: str, *, problems: int = 16, samples: int = 8,
                temperature: float | None = None, reference: bool = False, cache=None,
                echo: Callable[[str], None] = lambda s: None) -> dict:
    """The probe of the module docstring: ``receiver`` shown ``peer``'s successes as SGT-R would show them."""
    names = [p.name for p in cfg.policies]
    for role, name in (("receiver", receiver), ("peer", peer)):
        if name not in names:
            raise ConfigError(f"{role} {name!r} is not a policy of the experiment (policies: {', '.join(names)})")
    if receiver == peer:
        raise ConfigError("the receiver and the peer must be two different policies")
    task, verifier = build_task_from_config(cfg)
    fmt = cfg.task.answer_format
    chosen = task.train[:problems]
    sgt_r = cfg.sharing.for_receiver(receiver, names)[1].sgt_r or SgtRConfig()  # the receiver's own settings
    g = torch.Generator().manual_seed(cfg.seed)

    def temp(name: str) -> float:
        return temperature if temperature is not None else sampling_temperature(cfg.policies[names.index(name)])

    echo(f"[{peer}] sampling {len(chosen)} problems × {samples} (T {temp(peer)})")
    sampler = Sampler(cfg, names.index(peer), task, verifier, temp(peer), g, cache, echo)
    kept, peer_verified = peer_successes(sampler, chosen, verifier, samples, echo)
    del sampler
    gc.collect()
    echo(f"[{peer}] verified {peer_verified}/{len(chosen) * samples}, a success on "
         f"{sum(k is not None for k in kept)}/{len(chosen)} problems")

    rec = Sampler(cfg, names.index(receiver), task, verifier, temp(receiver), g, cache, echo)
    conditions = SgtRHints(rec.tok, kept, verifier, fmt, sgt_r).conditions(reference)
    rows = measure(rec, chosen, verifier, fmt, conditions, samples, echo)
    for kind, condition in conditions.items():
        rows[kind].update(refused=dict(condition.refused), masked=condition.masked)
    if reference:  # its one number is the answer itself, not an intermediate result
        rows["reference"]["hints_with_work"] = None
    return {"receiver": receiver, "peer": peer, "task": cfg.task.name, "dataset": cfg.task.dataset,
            "answer_format": fmt, "show": sgt_r.show, "problems": len(chosen), "samples": samples,
            "temperature": {peer: temp(peer), receiver: temp(receiver)},
            "peer_verified": peer_verified / max(len(chosen) * samples, 1),
            "peer_solved": sum(k is not None for k in kept), "conditions": rows,
            "verdict": verdict(rows, peer_verified)}


def verdict(rows: dict[str, dict], peer_verified: int) -> str:
    """One sentence: whether SGT-R's hints (the peer kinds; the reference control is not SGT-R's) give its rescue
    round more than its resample-only control would get, and what to try instead where they do not."""
    if peer_verified == 0:
        return ("the peer verified nothing on these problems: SGT-R would get no success to show; probe more "
                "problems, or a stronger peer")
    changes = {kind: rows[kind]["change"] for kind in HINT_KINDS if kind in rows}
    shown = {kind: c for kind, c in changes.items() if c["problems"] > 0}
    if not shown:
        return "every hint was refused (see the refusals): SGT-R would sample these prompts plainly"
    raising = [kind for kind, c in shown.items() if c["verdict"] == "raises"]
    if raising:
        return (f"the hints raise the receiver's verified rate ({', '.join(raising)}): SGT-R has something to "
                "rescue with on this pair; run it beside resample-only (`sharing.sgt_r.hint: none`)")
    if any(c["verdict"] == "lowers" for c in shown.values()):
        what = "lower"
    else:
        what = "do not measurably change"
    return (f"the hints {what} the receiver's verified rate on the problems the peer solves: SGT-R's rescue round "
            "would do no better than its resample-only control here; try a cooler sampler "
            "(`policies.N.engine.temperature`) and the guarded SGT (`sharing.mode: sgt`) instead")


def _written(row: dict) -> str:
    return "–" if row.get("written") is None else f"{row['written']}/{row['n']}"  # results from before the count


def render(result: dict) -> str:
    """The probe as a Markdown table and its verdict."""
    rows = result["conditions"]
    lines = [f"{result['receiver']} ← {result['peer']} on {result['task']}"
             + (f" ({result['dataset']})" if result.get("dataset") else "")
             + f", `{result['answer_format']}`, {result['problems']} problems × {result['samples']} samples; the "
             f"peer verified {result['peer_verified']:.0%} (a success on {result['peer_solved']} problems)", "",
             "| condition | hints (with work) | refused | in form | verified | answer written | plain, same problems "
             "| change per problem |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, row in rows.items():
        if name == PLAIN:
            lines.append(f"| {name} | – | – | {row['in_form']:.0%} | {row['verified_count']}/{row['n']} | "
                         f"{_written(row)} | – | – |")
            continue
        refused = ", ".join(f"{r} {n}" for r, n in row.get("refused", {}).items()) or "0"
        same = round(row["plain_verified_same_problems"] * row["n"])
        work = "–" if row["hints_with_work"] is None else row["hints_with_work"]
        lines.append(f"| {name} | {row['hints']} ({work}) | {refused} | {row['in_form']:.0%} | "
                     f"{row['verified_count']}/{row['n']} | {_written(row)} | {same}/{row['n']} | "
                     f"{_change_text(row['change'])} |")
    lines += ["", f"Verdict: {result['verdict']}."]
    return "\n".join(lines)
