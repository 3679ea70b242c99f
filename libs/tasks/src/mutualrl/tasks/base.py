"""The task base class: seeded, disjoint train and eval splits of verifiable problems."""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod

from mutualrl.tasks.problem import Problem, Verifier
from mutualrl.tasks.verifiers import answer_verifier


class Task(ABC):
    """A source of problems with disjoint, seeded train and eval splits.

    Splits are disjoint by prompt text: eval problems are drawn first from a
    dedicated RNG stream and removed from the training pool, so held-out
    accuracy measures generalisation, not memorisation.
    """

    name: str = "task"
    answer_format: str = "whole"
    """How a pretrained (instruct or base) model is asked to answer this task by default."""
    requirements: tuple[tuple[str, str], ...] = ()
    """(pip requirement, module) of each optional package the task needs; checked before a run starts."""

    def __init__(self, seed: int = 0, train_size: int = 20000, eval_size: int = 256):
        self.seed = seed
        self.train_size = train_size
        self.eval_size = eval_size
        self._train: list[Problem] | None = None
        self._eval: list[Problem] | None = None

    @abstractmethod
    def sample(self, rng: random.Random) -> Problem:
        """Draw one problem (may repeat; splitting dedups)."""

    def default_answer_format(self) -> str:
        """The answer format a pretrained model is asked for when the config leaves ``task.answer_format`` unset
        (the class's ``answer_format``; reasoning-gym reads it from its data)."""
        return self.answer_format

    def default_verifier(self, answer_format: str = "whole") -> Verifier:
        """The task's own verifier for answers given in ``answer_format`` (tasks.answers): the
        whole completion by default, as a built model is trained to answer."""
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
        if not train:  # a generator with few distinct problems: the held-out set, drawn first, took them all
            raise ValueError(f"task {self.name!r} produced no training problems: its generator gave "
                             f"{len(eval_set)} distinct problems and the held-out set (task.eval_size "
                             f"{self.eval_size}) took them all; widen the task's settings or lower task.eval_size")
        self._eval = list(eval_set.values())
        self._train = list(train.values())

    @property
    def train(self) -> list[Problem]:
        """The training problems (built on first use)."""
        if self._train is None:
            self._build_splits()
        assert self._train is not None
        return self._train

    @property
    def eval(self) -> list[Problem]:
        """The held-out problems (built on first use, never overlapping the training ones)."""
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
