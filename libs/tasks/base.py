"""Core task types shared by every task and verifier."""

from __future__ import annotations

import hashlib
import random
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
        return hashlib.sha1(self.prompt.encode("utf-8")).hexdigest()[:16]


class Verifier(ABC):
    """Scores a completion: 1.0 when verified correct, else 0.0."""

    name: str = "verifier"
    version: str = "1"

    @abstractmethod
    def score(self, problem: Problem, completion: str) -> float: ...

    def score_many(self, problems: list[Problem], completions: list[str]) -> list[float]:
        if len(problems) != len(completions):
            raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
        return [self.score(p, c) for p, c in zip(problems, completions)]


class Task(ABC):
    """A source of problems with disjoint, seeded train and eval splits.

    Splits are disjoint by prompt text: eval problems are drawn first from a
    dedicated RNG stream and removed from the training pool, so held-out
    accuracy measures generalisation, not memorisation.
    """

    name: str = "task"

    def __init__(self, seed: int = 0, train_size: int = 20000, eval_size: int = 256):
        self.seed = seed
        self.train_size = train_size
        self.eval_size = eval_size
        self._train: list[Problem] | None = None
        self._eval: list[Problem] | None = None

    @abstractmethod
    def sample(self, rng: random.Random) -> Problem:
        """Draw one problem (may repeat; splitting dedups)."""

    def default_verifier(self, answer_format: str = "whole") -> Verifier:
        """The task's own verifier for answers given in ``answer_format`` (tasks.answers): the
        whole completion by default, as a built model is trained to answer."""
        from mutualrl.tasks.verifiers import answer_verifier

        return answer_verifier(answer_format)

    def _build_splits(self) -> None:
        rng = random.Random(f"{self.name}:{self.seed}")
        eval_set: dict[str, Problem] = {}
        attempts = 0
        while len(eval_set) < self.eval_size and attempts < self.eval_size * 50:
            p = self.sample(rng)
            eval_set.setdefault(p.prompt, p)
            attempts += 1
        train: dict[str, Problem] = {}
        attempts = 0
        while len(train) < self.train_size and attempts < self.train_size * 20:
            p = self.sample(rng)
            if p.prompt not in eval_set:
                train.setdefault(p.prompt, p)
            attempts += 1
        if not train:
            raise ValueError(f"task {self.name!r} produced no training problems")
        self._eval = list(eval_set.values())
        self._train = list(train.values())

    @property
    def train(self) -> list[Problem]:
        if self._train is None:
            self._build_splits()
        assert self._train is not None
        return self._train

    @property
    def eval(self) -> list[Problem]:
        if self._eval is None:
            self._build_splits()
        assert self._eval is not None
        return self._eval

    def corpus(self) -> list[str]:
        """Texts a tokenizer for this task is trained on (prompts + answers)."""
        return [p.prompt + p.answer for p in self.train]

    def fingerprint(self) -> str:
        """Content hash of the splits: caches keyed by it invalidate when data changes."""
        h = hashlib.sha256()
        for p in self.train + self.eval:
            h.update(p.prompt.encode())
            h.update(b"\x00")
            h.update(p.answer.encode())
            h.update(b"\x01")
        return h.hexdigest()[:16]
