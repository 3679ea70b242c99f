"""What every task and verifier shares: a verifiable problem and the scorer of its completions."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Problem:
    """One verifiable problem.

    ``prompt_id`` is stable across processes and policies (a hash of the prompt
    text), so peers can line up groups for the same prompt without sharing
    Python objects.
    """

    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def prompt_id(self) -> str:
        """A stable id of the prompt (hash of its text): policies line up groups by it."""
        return hashlib.sha1(self.prompt.encode("utf-8")).hexdigest()[:16]


class Verifier(ABC):
    """Scores a completion: 1.0 when verified correct, else 0.0."""

    name: str = "verifier"
    version: str = "1"

    @abstractmethod
    def score(self, problem: Problem, completion: str) -> float:
        """1.0 when ``completion`` answers ``problem`` correctly, else 0.0."""

    def score_many(self, problems: list[Problem], completions: list[str]) -> list[float]:
        """Scores of completions, one per problem (a verifier may batch them)."""
        if len(problems) != len(completions):
            raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
        return [self.score(p, c) for p, c in zip(problems, completions)]
