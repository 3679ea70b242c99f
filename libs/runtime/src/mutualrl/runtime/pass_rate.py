"""A policy's sampled pass rate on a task before RL, and what it says about GRPO's signal.

GRPO learns only from groups whose rewards differ (docs/algorithms.md §1.1). A policy that never produces
an answer the verifier accepts — often because it cannot write the answer *form* the task asks for, not
because it cannot solve the problem — gets all-zero groups and trains on nothing, silently. Measured
once before RL, at the policy's own sampling temperature, this turns that into a WARNING and a field of
``summary.json``. The same completions are re-scored under every other answer format: a format under
which they would have scored is the first thing to try (``mutualrl probe`` measures it properly, with
the instruction of each format).

Zero passes in a few samples is weak evidence: 0 of n is seen with probability ≥ 5 % for every pass rate
below 1 − 0.05^(1/n) (31 % at n = 8; SmolLM2 at ~22 % on pair A's sums drew 0 of 8 at one seed and then
learned as at the others). So the note says GRPO *may* have no signal and states that bound; the learner's
own check (``eval.no_signal_steps``) is the one that sees the groups themselves.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mutualrl.models.policy import PromptStyle
from mutualrl.runtime.evaluation import scored_texts
from mutualrl.tasks import Problem, Verifier
from mutualrl.tasks.answers import ANSWER_FORMATS

NO_SIGNAL = "GRPO may have no signal on this task for this policy"


@dataclass
class PassRate:
    """Passes of ``problems`` sampled completions (one per problem) in the task's format, and what the same
    completions would score in each other format."""

    answer_format: str
    problems: int
    passed: int
    seconds: float
    temperature: float
    other_formats: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """The pass rate (0 when nothing was sampled)."""
        return self.passed / self.problems if self.problems else 0.0

    @property
    def upper95(self) -> float:
        """The one-sided 95 % upper bound on the pass rate when nothing passed: the rate p at which 0 passes of
        ``problems`` has probability 5 %, (1 − p)^n = 0.05 (1.0 when nothing was sampled). It is the figure the
        0 % warning states; with passes, the rate itself says there is signal."""
        return 1.0 - 0.05 ** (1.0 / self.problems) if self.problems else 1.0

    def summary(self) -> dict:
        """What ``summary.json`` keeps: the measurement, and at 0 % the no-signal note, the pass rate the
        sample cannot rule out (``rate_upper95``) and the formats that do better."""
        out = {**asdict(self), "rate": self.rate}
        if self.problems and self.passed == 0:
            out["no_signal"] = NO_SIGNAL
            out["rate_upper95"] = round(self.upper95, 4)
            out["better_formats"] = sorted((f for f, r in self.other_formats.items() if r > 0),
                                           key=lambda f: -self.other_formats[f])
        return out


def sampled_pass_rate(model: PreTrainedModel, tok: PreTrainedTokenizerBase, problems: list[Problem],
                      verifier: Verifier, answer_format: str, verifier_for: Callable[[str], Verifier],
                      style: PromptStyle | None, max_new_tokens: int, temperature: float, budget_s: float = 60.0,
                      chunk: int = 8, seed: int = 0) -> PassRate:
    """Sample each problem once at ``temperature`` (chunks of ``chunk``, stopping once ``budget_s`` is spent)
    and score the completions with ``verifier``; ``verifier_for(fmt)`` re-scores them in every other format."""
    t0 = time.monotonic()
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    done: list[Problem] = []
    texts: list[str] = []
    for i in range(0, len(problems), chunk):
        if done and time.monotonic() - t0 > budget_s:
            break
        part = problems[i : i + chunk]
        texts += scored_texts(model, tok, part, max_new_tokens, temperature, style, gen)
        done += part
    passed = int(sum(verifier.score_many(done, texts)))
    others = {}
    for fmt in ANSWER_FORMATS:
        if fmt != answer_format and texts:
            others[fmt] = sum(verifier_for(fmt).score_many(done, texts)) / len(done)
    return PassRate(answer_format, len(done), passed, round(time.monotonic() - t0, 1), temperature, others)
