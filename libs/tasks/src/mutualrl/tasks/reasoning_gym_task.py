"""reasoning-gym's procedural datasets as tasks, scored by each dataset's own scorer.

``reasoning-gym`` (PyPI) generates over 100 verifiable task families offline — arithmetic, search
(countdown), puzzles, word games — each with a ``score_answer(answer, entry)`` of its own. We use the
package itself, never a copy: a dataset is built with the task's seed, its items become
:class:`Problem` objects (the generator's entry kept in ``meta`` for scoring), and the held-out split
is carved out first, so no eval question is trained on.

The scorer may give partial credit (countdown gives 0.05 for a well-formed wrong expression); rewards
here are binary (docs/algorithms.md §0), so only a full score counts as a success.
"""

from __future__ import annotations

import random
from typing import Any

from typing_extensions import override

from mutualrl.tasks.answers import extract_answer, format_from_answers
from mutualrl.tasks.base import Problem, Task, Verifier

REQUIREMENT = "reasoning-gym>=0.1.25"
FORMAT_SAMPLE = 64
"""How many of a dataset's reference answers decide its default answer format."""


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError as e:
        raise RuntimeError(f"task reasoning_gym needs the reasoning-gym package (pip install '{REQUIREMENT}', or pip "
                           "install '.[real]')") from e
    return reasoning_gym


class ReasoningGymTask(Task):
    """One reasoning-gym dataset, generated with the task's seed (settings: the dataset's config fields)."""

    name = "reasoning_gym"
    requirements = ((REQUIREMENT, "reasoning_gym"),)

    def __init__(self, dataset: str, seed: int = 0, train_size: int = 20000, eval_size: int = 256,
                 settings: dict[str, Any] | None = None):
        rg = _reasoning_gym()
        if dataset not in rg.factory.DATASETS:
            close = sorted(n for n in rg.factory.DATASETS if n[:3] == dataset[:3]) or sorted(rg.factory.DATASETS)[:8]
            raise ValueError(f"unknown reasoning-gym dataset {dataset!r}; e.g. {', '.join(close)} "
                             f"({len(rg.factory.DATASETS)} in all)")
        self.dataset_name = dataset
        self.settings = dict(settings or {})
        self._entries: dict[str, dict] | None = None
        size = (train_size + eval_size) * 2  # room for the duplicates that splitting drops
        try:
            self._dataset = rg.create_dataset(dataset, seed=seed, size=size, **self.settings)
        except (TypeError, ValueError, AssertionError) as e:
            raise ValueError(f"reasoning-gym dataset {dataset!r} rejects settings {self.settings}: {e}") from None
        super().__init__(seed=seed, train_size=train_size, eval_size=eval_size)

    @override
    def sample(self, rng: random.Random) -> Problem:
        index = rng.randrange(len(self._dataset))
        entry = self._dataset[index]
        return Problem(prompt=entry["question"], answer=str(entry["answer"]),
                       meta={"entry": entry, "dataset": self.dataset_name})

    @override
    def default_answer_format(self) -> str:
        """From the data, not a list of names: ``last_number`` when every one of the first
        ``FORMAT_SAMPLE`` training answers (at the dataset's own settings) is a number, else
        ``answer_tags``."""
        return format_from_answers([p.answer for p in self.train[:FORMAT_SAMPLE]])

    def score_answer(self, answer: str | None, problem: Problem) -> float:
        """The dataset's own score of ``answer`` (0 when no answer could be extracted)."""
        if answer is None:
            return 0.0
        entry = problem.meta.get("entry")
        if entry is None:  # a Problem rebuilt without its entry (another process): regenerate the item
            entry = self._find_entry(problem)
        try:
            return float(self._dataset.score_answer(answer=answer, entry=entry))
        except Exception:  # a scorer that chokes on a malformed answer gives it nothing, never a crash
            return 0.0

    def _find_entry(self, problem: Problem) -> dict:
        if self._entries is None:  # indexed once, not searched per score
            self._entries = {p.prompt: p.meta["entry"] for p in self.train + self.eval}
        return self._entries.get(problem.prompt) or {"question": problem.prompt, "answer": problem.answer,
                                                     "metadata": {}}

    @override
    def default_verifier(self, answer_format: str = "whole") -> Verifier:
        return ReasoningGymVerifier(self, answer_format)


class ReasoningGymVerifier(Verifier):
    """Extract the answer in the task's format, then score it with the dataset's scorer; only a
    full score (≥ 1) is a success."""

    name = "reasoning_gym"

    def __init__(self, task: ReasoningGymTask, answer_format: str):
        self.task = task
        self.answer_format = answer_format
        self.version = f"{task.dataset_name}:{answer_format}"

    @override
    def score(self, problem: Problem, completion: str) -> float:
        return 1.0 if self.task.score_answer(extract_answer(completion, self.answer_format),
                                             problem) >= 1.0 - 1e-9 else 0.0
