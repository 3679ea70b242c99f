"""Held-out greedy accuracy (the number every curve and summary reports)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mutualrl.models.generation import cut_at_stop, sample, stop_string_check, text_decoder
from mutualrl.models.policy import PromptStyle, encode_prompt
from mutualrl.tasks import Problem, Verifier


def greedy_accuracy(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    problems: list[Problem],
    verifier: Verifier,
    max_new_tokens: int,
    batch_size: int = 256,
    prompt_style: PromptStyle | None = None,
) -> float:
    """Held-out accuracy: greedy completions of ``problems``, scored by ``verifier``."""
    return greedy_eval(model, tok, problems, verifier, max_new_tokens, batch_size, prompt_style).accuracy


@dataclass
class EvalResult:
    """One held-out evaluation: the accuracy, and per problem its greedy completion and score (what a per-problem
    paired comparison and an answer-style analysis read)."""
    accuracy: float
    texts: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    cut_off: list[bool] = field(default_factory=list)  # per problem: the token limit ended its completion

    def record(self, step: int, problems: list[Problem]) -> dict:
        """The line an evaluation log keeps: the step, the accuracy, each problem's id, score, whether the token
        limit cut its completion off, and the completion."""
        return {"step": step, "accuracy": self.accuracy, "prompt_ids": [p.prompt_id for p in problems],
                "correct": "".join("1" if s > 0 else "0" for s in self.scores),
                "cut_off": "".join("1" if c else "0" for c in self.cut_off), "texts": self.texts}


def greedy_eval(model: PreTrainedModel, tok: PreTrainedTokenizerBase, problems: list[Problem], verifier: Verifier,
                max_new_tokens: int, batch_size: int = 256, prompt_style: PromptStyle | None = None) -> EvalResult:
    """:func:`greedy_accuracy` with each problem's completion and score."""
    if not problems:
        return EvalResult(0.0)
    texts: list[str] = []
    scores: list[float] = []
    cut_off: list[bool] = []
    for i in range(0, len(problems), batch_size):
        chunk = problems[i : i + batch_size]
        done = scored_completions(model, tok, chunk, max_new_tokens, 0.0, prompt_style)
        chunk_texts = [c.text for c in done]
        texts += chunk_texts
        scores += verifier.score_many(chunk, chunk_texts)
        cut_off += [c.cut_off for c in done]
    return EvalResult(sum(scores) / len(problems), texts, scores, cut_off)


@dataclass(frozen=True)
class ScoredCompletion:
    """A completion as the verifier reads it, and whether the token limit ended it (no EOS, no stop string): a
    verifier that reads the last number of an unfinished explanation can pass it by accident."""
    text: str
    cut_off: bool


def scored_completions(model: PreTrainedModel, tok: PreTrainedTokenizerBase, problems: list[Problem],
                       max_new_tokens: int, temperature: float, prompt_style: PromptStyle | None,
                       generator: torch.Generator | None = None) -> list[ScoredCompletion]:
    """One completion per problem, prompted as the policy is and sampled at ``temperature`` (0: greedy), as the
    verifier reads it (cut at the style's first stop string). Evaluation, the pass rate before RL and
    ``mutualrl probe`` all score these."""
    stops = prompt_style.stops(tok) if prompt_style else ()
    outs = sample(model, [encode_prompt(tok, p.prompt, prompt_style) for p in problems], eos_id=tok.eos_token_id,
                  pad_id=tok.pad_token_id, max_new_tokens=max_new_tokens, temperature=temperature, generator=generator,
                  stop=stop_string_check(text_decoder(tok), stops))
    return [ScoredCompletion(completion_text(tok, o, prompt_style), o.finish_reason == "length") for o in outs]


def scored_texts(model: PreTrainedModel, tok: PreTrainedTokenizerBase, problems: list[Problem], max_new_tokens: int,
                 temperature: float, prompt_style: PromptStyle | None,
                 generator: torch.Generator | None = None) -> list[str]:
    """:func:`scored_completions`' texts."""
    return [c.text for c in scored_completions(model, tok, problems, max_new_tokens, temperature, prompt_style,
                                               generator)]


def completion_text(tok: PreTrainedTokenizerBase, sample_out, prompt_style: PromptStyle | None) -> str:
    """A sample's text as it is scored: decoded, and cut at the style's first stop string."""
    decode = text_decoder(tok)
    stops = prompt_style.stops(tok) if prompt_style else ()
    return cut_at_stop(decode, sample_out, stops)[1] if stops else decode(sample_out.token_ids)
