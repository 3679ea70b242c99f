"""Getting the answer out of a completion, the way a task asks for it (docs/algorithms.md §5.3).

A built tiny model is trained to emit the bare answer, so matching the whole completion is right for
it. An instruct model answers in sentences ("4 - 1 = 3", "The answer is 19."): whole-completion
matching scores every such answer 0, and GRPO then sees all-fail groups only. Each format here is
what a task's instruction tells the model to write; the verifier compares the extracted answer.
"""

from __future__ import annotations

import re
from typing import Literal, Optional

AnswerFormat = Literal["whole", "last_number", "boxed", "answer_tags", "last_line"]
ANSWER_FORMATS: tuple[str, ...] = ("whole", "last_number", "boxed", "answer_tags", "last_line")

INSTRUCTIONS: dict[str, str] = {
    "whole": "",
    "last_number": "Solve the problem. Give the final answer as a number at the end of your reply.",
    "boxed": "Solve the problem. Put the final answer in \\boxed{}.",
    "answer_tags": "Solve the problem. Give the final answer between <answer> and </answer>, "
                   "with nothing else inside the tags.",
    "last_line": "Solve the problem. Write only the final answer on the last line of your reply.",
}
"""The default instruction (rendered as the system message of a chat template) of each format."""

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_TAGS = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _last_number(text: str) -> Optional[str]:
    found = _NUMBER.findall(text)
    if not found:
        return None
    value = found[-1].replace(",", "")
    if "." in value:  # 19.0 and 19. are 19; 1.50 is 1.5
        value = value.rstrip("0").rstrip(".") or "0"
    return "0" if value in ("-0", "") else value


def _boxed_span(text: str) -> tuple[int, int] | None:
    """Where the content of the last ``\\boxed{…}`` stands (braces balanced), or None (none, or cut off)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return i, j
    return None  # unbalanced: the answer was cut off


def _last_boxed(text: str) -> Optional[str]:
    span = _boxed_span(text)
    return text[span[0]:span[1]].strip() if span else None


def extract_answer(text: str, fmt: str) -> Optional[str]:
    """The answer ``text`` gives in format ``fmt``, or None when it gives none."""
    if fmt == "whole":
        return text.strip()
    if fmt == "last_number":
        return _last_number(text)
    if fmt == "boxed":
        return _last_boxed(text)
    if fmt == "answer_tags":
        found = _TAGS.findall(text)
        return found[-1].strip() if found else None
    if fmt == "last_line":
        lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
        return lines[-1] if lines else None
    raise ValueError(f"unknown answer format {fmt!r}; valid: {', '.join(ANSWER_FORMATS)}")


def normalise_number(value: str) -> str:
    """A reference answer in the form :func:`extract_answer`'s ``last_number`` gives."""
    return _last_number(value) or value.strip()


def is_number(text: str) -> bool:
    """Whether ``text`` is one number as ``last_number`` extracts it (``-3``, ``1,024``, ``0.5``)."""
    return _NUMBER.fullmatch(text.strip()) is not None


def format_from_answers(answers: list[str]) -> str:
    """The answer format a model is asked for, read from a task's reference answers: ``last_number`` when
    every one is a number (an instruct model ends on its number; no tags to learn), else ``answer_tags``
    (an answer that is a word, a list or an expression needs a delimiter)."""
    return "last_number" if answers and all(is_number(a) for a in answers) else "answer_tags"


MASK = "…"
"""What stands where a hint's answer was: the hint keeps the answer's form (``<answer>…</answer>``,
``\\boxed{…}``, a number's place at the end) and loses its content."""


def answer_span(text: str, fmt: str) -> tuple[int, int] | None:
    """Where in ``text`` the answer :func:`extract_answer` reads in format ``fmt`` stands, as a (start, end) slice
    (the tags, box or line around it excluded), or None when the text gives no answer."""
    if fmt == "whole":
        stripped = text.strip()
        if not stripped:
            return None
        start = text.index(stripped)
        return start, start + len(stripped)
    if fmt == "last_number":
        found = list(_NUMBER.finditer(text))
        return (found[-1].start(), found[-1].end()) if found else None
    if fmt == "boxed":
        return _boxed_span(text)
    if fmt == "answer_tags":
        found = list(_TAGS.finditer(text))
        return (found[-1].start(1), found[-1].end(1)) if found else None
    if fmt == "last_line":
        lines = [m for m in re.finditer(r"[^\r\n]+", text) if m.group().strip()]
        return (lines[-1].start(), lines[-1].end()) if lines else None
    raise ValueError(f"unknown answer format {fmt!r}; valid: {', '.join(ANSWER_FORMATS)}")


def reasoning_before(text: str, fmt: str) -> str:
    """The text before the final answer *and its form's opening* (``<answer>``, ``\\boxed{``, the last line): the
    work a completion shows before it answers ("" for a bare answer; the whole text when no answer reads from it)."""
    span = answer_span(text, fmt)
    if span is None:
        return text
    start = span[0]
    if fmt == "answer_tags":
        start = text.rfind("<answer>", 0, span[0] + 1)
    elif fmt == "boxed":
        start = text.rfind("\\boxed{", 0, span[0] + 1)
    return text[: max(0, start)].rstrip()


def standalone_answer(answer: str) -> re.Pattern:
    """The reference ``answer`` where it stands alone in a text: not inside a longer word or number (``46`` is not in
    ``146`` or ``46.5``; a full stop after it is not a decimal)."""
    return re.compile(r"(?<![\w.])" + re.escape(answer.strip()) + r"(?![\w]|\.\d)")


def mask_answer(text: str, fmt: str, gives_answer, answer: str | None = None) -> tuple[str, bool]:
    """``text`` with the answer it would give away replaced by :data:`MASK`, and whether anything was masked.

    ``gives_answer(text)`` is the task's own check (its verifier scoring the text as a completion). While it says
    yes, the span the answer format reads is masked — the last answer first, then earlier ones the parser falls
    back to (a reasoning that states the result twice) — so the form stays and the content goes. With ``answer``
    (the reference), every other standalone occurrence of it goes too: "the sum is 46, as 12 + 34 shows" gives the
    answer away to a reader though no parser reads it at the end. A text in which the answer still reads after all
    that (``whole`` format, an answer spelled out in words) comes back as :data:`MASK` alone: it carries nothing
    the verifier does not already know."""
    masked = False
    for _ in range(64):  # each pass removes one occurrence; a hint has few
        if not gives_answer(text):
            break
        span = answer_span(text, fmt)
        if span is None or text[span[0]:span[1]] == MASK:
            break
        text, masked = text[: span[0]] + MASK + text[span[1]:], True
    if answer and answer.strip():
        text, n = standalone_answer(answer).subn(MASK, text)
        masked = masked or n > 0
    return (text, masked) if not gives_answer(text) else (MASK, True)


def required_form(answer: str, fmt: str) -> str:
    """The reference answer written as format ``fmt`` asks for it: what the information gate measures a hint's
    effect on (the receiver's log-probability of writing it)."""
    if fmt == "boxed":
        return f"\\boxed{{{answer}}}"
    if fmt == "answer_tags":
        return f"<answer>{answer}</answer>"
    if fmt in ("whole", "last_number", "last_line"):
        return answer
    raise ValueError(f"unknown answer format {fmt!r}; valid: {', '.join(ANSWER_FORMATS)}")
