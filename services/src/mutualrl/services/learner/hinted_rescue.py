"""SGT-R's second round within a step: rescue samples of the receiver's own, on prompts a peer solved
(docs/algorithms.md §3.5).

After the step's own rollouts and peers' re-verified successes are in, each own group at or under the gate that a
peer solved (or, for the controls, any such group) gets k more samples from the receiver's own engine — on the
prompt with the peer's success shown as a hint (answer masked), or on the plain prompt when the information gate
finds the hint does not help the receiver. The receiver's verifier scores them; those above the receiver's own
baseline on the prompt join the step as ``HINTED`` rows under the *hint-free* prompt, each token weighted toward the
hint-free policy (``mutualrl.grpo.hinted``); the rest are counted, not trained.

Everything a peer's text must pass before it is shown is checked here, per hint, with a reason when refused: its
length in the receiver's tokens, that it spells back exactly through the receiver's tokenizer, that it names none
of the receiver's control tokens nor the hint frame's delimiters. A refused hint is counted and its prompt gets
plain samples instead; the step goes on.
"""

from __future__ import annotations

import logging
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers import PreTrainedTokenizerBase

from mutualrl.config.schema import SgtRConfig
from mutualrl.grpo import RescueItem, hint_fraction, hint_weights
from mutualrl.models.generation import Sample, cut_at_stop, text_decoder
from mutualrl.models.policy import PromptStyle, encode_prompt
from mutualrl.models.text_checks import control_text_in, spells
from mutualrl.services.learner.objective import HINTED, Rows
from mutualrl.services.learner.rescue_requests import RescueUnavailable
from mutualrl.tasks import Problem, Verifier
from mutualrl.tasks.answers import reasoning_before, required_form
from mutualrl.tasks.hints import Hint, build_hint, reference_hint

log = logging.getLogger(__name__)

SampleFn = Callable[[list[list[int]], int, int, int], list[list[Sample]]]
"""``sample(prompt_token_ids, n, seed, step)``: n completions per prompt from the policy's own engine, at its sampling
settings, with their behaviour log-probs (in-process under ``run``; over SEE under ``up``: rescue_requests.py). May
raise :class:`~mutualrl.services.learner.rescue_requests.RescueUnavailable`."""
LogprobFn = Callable[[list[list[int]], list[list[int]]], torch.Tensor]
"""``logprobs(prompts, completions)``: the learner's [b, T] right-aligned log-probs, no gradient."""

EDGE_COUNTS = ("hints_offered", "hints_gated_out", "hints_masked", "hints_refused", "rescue_samples", "rescued",
               "rescue_trained", "rescue_cut_off", "rescue_verified_nothing")
"""What a step counts per incoming edge (records, Prometheus, the sharing dashboard)."""

HINT_DELIMITERS = ("<hint>", "</hint>")
HINT_REFUSALS = ("frame", "control_token", "unspellable", "too_long", "context", "unavailable_timeout",
                 "unavailable_refused", "unavailable_malformed")
"""Why a hint was not shown (its prompt got plain samples), or why a round got no samples at all."""


def hint_refusal(tok: PreTrainedTokenizerBase, text: str, max_hint_tokens: int) -> str | None:
    """Why a hint's ``text`` cannot be shown to the receiver whose tokenizer is ``tok``, or None: the checks of the
    module docstring, in order (``mutualrl probe-hints`` applies the same ones)."""
    if any(d in text for d in HINT_DELIMITERS):
        return "frame"  # it would close the hint's frame and write outside it
    if control_text_in(tok, text) is not None:
        return "control_token"
    if not spells(tok, text):
        return "unspellable"
    if len(tok(text, add_special_tokens=False)["input_ids"]) > max_hint_tokens:
        return "too_long"
    return None


@dataclass
class Plan:
    """One rescued prompt: the plain and the sampled prompt's token ids, the hint shown (None: plain samples), the
    edge it came from and the gate's Δ."""
    problem: Problem
    plain_ids: list[int]
    sampled_ids: list[int]
    source: str
    hint: Hint | None = None
    delta: float | None = None
    gated_out: bool = False  # the information gate sent it to plain samples
    trace: str = ""  # the peer's reasoning before its final answer, unmasked (what the gate measures)


@dataclass
class RescueOutcome:
    """What the second round did this step: per-edge counts, refusals by reason, the gate's Δ values."""
    per_source: dict[str, Counter] = field(default_factory=dict)
    refused: Counter = field(default_factory=Counter)
    deltas: list[float] = field(default_factory=list)
    weight_metrics: dict[str, float] = field(default_factory=dict)
    examples: list[dict] = field(default_factory=list)  # a few (hint, rescue sample) pairs a step, for the reports

    def count(self, source: str, key: str, n: int = 1) -> None:
        """Add ``n`` to ``key`` of the edge from ``source``."""
        self.per_source.setdefault(source, Counter())[key] += n

    def metrics(self) -> dict:
        """The step record's fields."""
        total = Counter()
        for c in self.per_source.values():
            total.update(c)
        return {**{k: total[k] for k in EDGE_COUNTS},
                "hint_refused": dict(self.refused),
                "hint_delta_mean": sum(self.deltas) / len(self.deltas) if self.deltas else None,
                **self.weight_metrics, **({"hint_examples": self.examples} if self.examples else {})}


class HintedRescue:
    """The receiver's rescue round (SGT-R). ``sample`` is its own engine; ``logprobs`` its learner's forward."""

    def __init__(self, policy: str, cfg: SgtRConfig, tokenizer: PreTrainedTokenizerBase, style: PromptStyle | None,
                 verifier: Verifier, answer_format: str, sample: SampleFn, logprobs: LogprobFn, *, group_size: int,
                 seed: int = 0, max_context: int | None = None, max_new_tokens: int = 0):
        self.policy, self.cfg, self.tok, self.style = policy, cfg, tokenizer, style
        self.verifier, self.answer_format = verifier, answer_format
        self.sample, self.logprobs = sample, logprobs
        self.group_size, self.seed = group_size, seed
        self.max_context, self.max_new_tokens = max_context, max_new_tokens

    # ---- which prompts -----------------------------------------------------------------------------------------
    def _chosen(self, own_successes: dict[str, int], candidates: list[RescueItem],
                problems: dict[str, Problem]) -> list[tuple[str, list[RescueItem]]]:
        """Prompts at or under the gate, fewest own successes first, at most ``max_prompts``: with the peers'
        successes on each (a prompt no peer solved is rescued only under the reference-answer control)."""
        threshold = self.cfg.gate_tau * self.group_size
        by_prompt: dict[str, list[RescueItem]] = {}
        for c in sorted(candidates, key=lambda c: c.message_id):
            by_prompt.setdefault(c.prompt_id, []).append(c)
        gated = [pid for pid, n in own_successes.items() if n <= threshold and pid in problems
                 and (pid in by_prompt or self.cfg.hint == "reference")]
        gated.sort(key=lambda pid: (own_successes[pid], pid))
        return [(pid, by_prompt.get(pid, [])) for pid in gated[: self.cfg.max_prompts]]

    def _refusal(self, hint: Hint) -> str | None:
        """Why a hint cannot be shown to this receiver, or None."""
        return hint_refusal(self.tok, hint.text, self.cfg.max_hint_tokens)

    def _hint(self, step: int, problem: Problem, item: RescueItem | None) -> Hint:
        if item is None:
            return reference_hint(problem.prompt, problem.answer)
        fraction = hint_fraction(step, self.cfg.prefix_start, self.cfg.prefix_end, self.cfg.prefix_steps)
        return build_hint(problem.prompt, item.text, show=self.cfg.show, fraction=fraction,
                          answer_format=self.answer_format,
                          gives_answer=lambda t, p=problem: self.verifier.score(p, t) > 0, answer=problem.answer)

    def _plans(self, step: int, chosen: list[tuple[str, list[RescueItem]]], problems: dict[str, Problem],
               out: RescueOutcome) -> list[Plan]:
        plans: list[Plan] = []
        for pid, items in chosen:
            problem = problems[pid]
            plain = encode_prompt(self.tok, problem.prompt, self.style)
            if self.cfg.hint == "none":
                plans.append(Plan(problem, plain, plain, items[0].source_policy))
                continue
            options: list[Plan] = []
            for item in (items[:3] if self.cfg.hint == "peer" else [None]):
                source = item.source_policy if item is not None else "reference"
                hint = self._hint(step, problem, item)
                out.count(source, "hints_offered")
                reason = self._refusal(hint)
                hinted = encode_prompt(self.tok, hint.question, self.style)
                if reason is None and self.max_context and len(hinted) + self.max_new_tokens > self.max_context:
                    reason = "context"  # the hinted prompt leaves the model no room to answer
                if reason is not None:
                    out.count(source, "hints_refused")
                    out.refused[reason] += 1
                    log.info("policy %s: a hint from %s on prompt %s refused: %s", self.policy, source, pid, reason)
                    continue
                if hint.masked:
                    out.count(source, "hints_masked")
                trace = reasoning_before((item.text if item is not None else hint.text).strip(), self.answer_format)
                options.append(Plan(problem, plain, hinted, source, hint, trace=trace))
            if not options:  # every hint refused: the prompt is still solvable, sample it plainly
                plans.append(Plan(problem, plain, plain, items[0].source_policy if items else "reference"))
                continue
            plans.append(self._gate(options))
        return plans

    def _gate(self, options: list[Plan]) -> Plan:
        """The information gate (§3.5): Δ = log π(a | x ⊕ h, r) − log π(a | x), a the verified answer in the
        required form, h the hint in the receiver's prompt and r the peer's work before its final answer,
        teacher-forced as the start of the receiver's completion — how much more likely the receiver is to answer
        as asked after seeing the hint and following the peer's work than on its own. A bare answer brings no work
        but may bring the form (``<answer>…</answer>``); a masked bare number brings neither (Δ ≈ 0). The best hint
        is used when its Δ exceeds ``min_gain``, else the prompt gets plain samples."""
        form = required_form(options[0].problem.answer, self.answer_format)
        lead = " " if self.style is not None and self.style.form(self.tok) == "completion" else ""
        alone = self.tok(lead + form, add_special_tokens=False)["input_ids"]
        after_work = self.tok(" " + form, add_special_tokens=False)["input_ids"]
        prompts = [options[0].plain_ids] + [o.sampled_ids for o in options]
        completions = [alone] + [self.tok(lead + o.trace, add_special_tokens=False)["input_ids"] + after_work
                                 if o.trace else alone for o in options]
        lp = self.logprobs(prompts, completions)  # [1 + options, T], right-aligned: the answer's tokens last
        answer_lengths = [len(alone)] + [len(after_work) if o.trace else len(alone) for o in options]
        values = [lp[i, lp.shape[1] - n:].sum().item() for i, n in enumerate(answer_lengths)]
        for o, value in zip(options, values[1:]):
            o.delta = value - values[0]
        best = max(options, key=lambda o: o.delta)
        if self.cfg.min_gain is not None and best.delta <= self.cfg.min_gain:
            return Plan(best.problem, best.plain_ids, best.plain_ids, best.source, None, best.delta, gated_out=True,
                        trace=best.trace)
        return best

    # ---- the round ---------------------------------------------------------------------------------------------
    def add_rows(self, step: int, rows: Rows, own_successes: dict[str, int], candidates: list[RescueItem],
                 problems: dict[str, Problem]) -> RescueOutcome:
        """Sample and score this step's rescue samples; append those above the receiver's own baseline to ``rows``
        (kind ``HINTED``), count all of them."""
        out = RescueOutcome()
        chosen = self._chosen(own_successes, candidates, problems)
        if not chosen:
            return out
        plans = self._plans(step, chosen, problems, out)
        for p in plans:
            if p.delta is not None:
                out.deltas.append(p.delta)
            if p.gated_out:
                out.count(p.source, "hints_gated_out")
        k = self.cfg.samples
        seed = zlib.crc32(f"{self.seed}:{self.policy}:{step}:rescue".encode())
        try:
            groups = self.sample([p.sampled_ids for p in plans], k, seed, step)
        except RescueUnavailable as e:  # the step trains without its second round, and says why
            out.refused[f"unavailable_{e.reason}"] += 1
            log.warning("policy %s: no rescue samples at step %d (%s)", self.policy, step, e)
            return out
        samples, owners = self._cut([s for g in groups for s in g]), [p for p in plans for _ in range(k)]
        texts = [t for _, t in samples]
        rewards = self.verifier.score_many([p.problem for p in owners], texts)
        kept = [(s, p, r) for (s, _), p, r in zip(samples, owners, rewards) if s.token_ids]
        if not kept:
            return out
        plain = [p.plain_ids for _, p, _ in kept]
        tokens = [s.token_ids for s, _, _ in kept]
        hint_free = self.logprobs(plain, tokens)  # [R, T]: π_θ at the start of the step, hint-free
        T = hint_free.shape[1]
        behaviour = torch.zeros_like(hint_free)
        mask = torch.zeros_like(hint_free)
        for i, (s, _, _) in enumerate(kept):
            behaviour[i, T - len(s.logprobs):] = torch.tensor(s.logprobs, dtype=hint_free.dtype)
            mask[i, T - len(s.logprobs):] = 1.0
        w, w_metrics = hint_weights(hint_free, behaviour, mask, w_min=self.cfg.w_min, w_max=self.cfg.w_max)
        out.weight_metrics = {k: float(v) for k, v in w_metrics.items()}  # over every rescue sample: hint acceptance
        # what pushes a row: its reward above the receiver's own mean on the prompt. Only those rows join the step; a
        # rescue sample at or under it would train nothing and only enlarge token-mean's divisor, shrinking the own
        # rows' gradient — so a round that trains nothing leaves the step as isolated GRPO's (§3.5). A verified sample
        # the token limit cut off is not trained either (unless train_cut_off): its text did not end, so the answer
        # the verifier read is where it stopped, not what it concluded — a ramble whose last number happened to be
        # right, which one positive row with no negative beside it would teach (§3.5)
        baseline = {id(p): own_successes[p.problem.prompt_id] / self.group_size for p in plans}
        above = [r > baseline[id(p)] for _, p, r in kept]
        trains = [a and (self.cfg.train_cut_off or s.finish_reason != "length") for a, (s, _, _) in zip(above, kept)]
        for i, (s, p, r) in enumerate(kept):
            if not trains[i]:
                continue
            n = len(s.token_ids)
            rows.add(prompt_token_ids=p.plain_ids, token_ids=s.token_ids, logprobs=hint_free[i, T - n:].tolist(),
                     mask=[1.0] * n, reward=r, prompt_id=p.problem.prompt_id, source_policy=p.source, kind=HINTED,
                     source_mean_logprob=0.0, token_weight=w[i, T - n:].tolist())
        out.examples = self._examples(plans, [(p, t, r, s.finish_reason == "length")
                                              for (s, t), p, r in zip(samples, owners, rewards)])
        for p in plans:
            got = [(r, a, t) for (_, q, r), a, t in zip(kept, above, trains) if q is p]
            out.count(p.source, "rescue_samples", len(got))
            out.count(p.source, "rescued", sum(1 for r, _, _ in got if r > 0))
            out.count(p.source, "rescue_trained", sum(1 for _, _, t in got if t))
            out.count(p.source, "rescue_cut_off", sum(1 for _, a, t in got if a and not t))
            if not any(r > 0 for r, _, _ in got):
                out.count(p.source, "rescue_verified_nothing")
        return out

    @staticmethod
    def _examples(plans: list[Plan], scored: list[tuple[Plan, str, float, bool]], per_step: int = 2) -> list[dict]:
        """Up to ``per_step`` rescued prompts of the step as the reports show them: the edge, the hint (None: plain
        samples), the gate's Δ, and a rescue sample — a verified one when there is one, one that ended before one
        the token limit cut off."""
        out = []
        for p in plans[:per_step]:
            mine = [(t, r, c) for q, t, r, c in scored if q is p]
            if not mine:
                continue
            text, reward, cut_off = max(mine, key=lambda x: (x[1], not x[2]))
            out.append({"source": p.source, "prompt": p.problem.prompt, "hint": p.hint.text if p.hint else None,
                        "delta": p.delta, "sample": text, "reward": reward, "cut_off": cut_off})
        return out

    def _cut(self, samples: list[Sample]) -> list[tuple[Sample, str]]:
        """Each sample with its text, cut at the receiver's stop strings (a completion-form receiver does not
        continue the hint's frame into a new question)."""
        stops = self.style.stops(self.tok) if self.style is not None else ()
        decode = text_decoder(self.tok)
        if stops:
            return [cut_at_stop(decode, s, stops) for s in samples]
        return [(s, decode(s.token_ids)) for s in samples]
