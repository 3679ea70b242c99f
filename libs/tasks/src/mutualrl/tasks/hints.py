"""A peer's verified success as a hint in a receiver's prompt (SGT-R, docs/algorithms.md §3.5).

The hint is data, not instructions: it sits inside :data:`HINT_TEMPLATE`, a fixed frame around the task's own
question, and the whole text then goes through the receiver's own prompt style (chat template or completion form)
as any question does. What the hint shows is cut from the peer's text here — all of it, its reasoning, or a first
fraction — and the answer it would give away is masked, keeping its form (:func:`mutualrl.tasks.answers.mask_answer`).
Which tokens a receiver's tokenizer treats as control tokens is checked where the tokenizer is (the learner).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from mutualrl.tasks.answers import MASK, answer_span, mask_answer

HINT_TEMPLATE = ("{question}\n\n"
                 "A hint from another solver follows (a final answer in it may be hidden as {mask}). "
                 "Use it if it helps, then write your own complete solution.\n"
                 "<hint>\n{hint}\n</hint>")
"""The frame a hint is shown in: the question first, then the hint between fixed delimiters."""

HintShow = Literal["all", "reasoning", "prefix"]


@dataclass(frozen=True)
class Hint:
    """What a receiver is shown: the hint text (answer masked), whether masking took something out, and the
    question with the hint in its frame."""
    text: str
    masked: bool
    question: str


def hint_excerpt(text: str, show: HintShow, fraction: float, answer_format: str) -> str:
    """The part of a peer's ``text`` a hint shows: ``all``; ``reasoning`` — the text before its final answer (the
    form's opening kept, e.g. ``… <answer>``), the whole text when no answer reads from it; ``prefix`` — its first
    ``fraction`` of characters, ended at a word boundary."""
    if show == "all":
        return text
    if show == "reasoning":
        span = answer_span(text, answer_format)
        return text[: span[0]].rstrip() if span is not None and span[0] > 0 else text
    if show == "prefix":
        return hint_prefix(text, fraction)
    raise ValueError(f"unknown hint show {show!r}; valid: all, reasoning, prefix")


def hint_prefix(text: str, fraction: float) -> str:
    """The first ``fraction`` of ``text`` by characters, ended at a word boundary (never mid-word; at least one
    word when ``fraction > 0``)."""
    if fraction >= 1.0:
        return text
    if fraction <= 0.0:
        return ""
    cut = max(1, int(len(text) * fraction))
    while cut < len(text) and not text[cut].isspace():
        cut += 1
    return text[:cut].rstrip()


def build_hint(question: str, peer_text: str, *, show: HintShow, fraction: float, answer_format: str,
               gives_answer: Callable[[str], bool], answer: str | None) -> Hint:
    """The hint a peer's verified ``peer_text`` becomes for ``question``: cut as ``show`` says, its answer masked
    where the task's own check (``gives_answer``, the verifier) would read it — and wherever the reference
    ``answer`` stands alone — then framed by :data:`HINT_TEMPLATE`."""
    excerpt = hint_excerpt(peer_text.strip(), show, fraction, answer_format)
    text, masked = mask_answer(excerpt, answer_format, gives_answer, answer)
    return Hint(text, masked, HINT_TEMPLATE.format(question=question, hint=text, mask=MASK))


def reference_hint(question: str, answer: str) -> Hint:
    """The control of a reference-answer hint (no peer): the task's own answer, unmasked — STaR's
    rationalisation, the receiver writes the work."""
    text = f"The final answer is {answer}."
    return Hint(text, False, HINT_TEMPLATE.format(question=question, hint=text, mask=MASK))
