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


def _last_boxed(text: str) -> Optional[str]:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None  # unbalanced: the answer was cut off


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
