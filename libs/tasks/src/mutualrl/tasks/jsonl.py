"""Problems from a local JSONL file: one ``{"prompt": ..., "answer": ...}`` per line."""

from __future__ import annotations

import json
import random
from pathlib import Path

from typing_extensions import override

from mutualrl.tasks.base import Problem, Task


class JsonlTask(Task):
    """A fixed dataset split into train/eval by a seeded shuffle.

    Malformed lines are errors that name the file and line number: silently
    skipping them would change the dataset without anyone noticing.
    """

    name = "jsonl"

    def __init__(self, path: str, seed: int = 0, train_size: int = 0, eval_size: int = 256):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"task file does not exist: {self.path}")
        self._rows = _read_rows(self.path)
        if len(self._rows) < 2:
            raise ValueError(f"{self.path}: need at least 2 problems, found {len(self._rows)}")
        super().__init__(seed=seed, train_size=train_size, eval_size=eval_size)

    @override
    def sample(self, rng: random.Random) -> Problem:
        return rng.choice(self._rows)

    def _build_splits(self) -> None:
        rows = self._rows[:]
        random.Random(f"jsonl:{self.seed}").shuffle(rows)
        n_eval = min(self.eval_size, max(1, len(rows) // 5))
        self._eval = rows[:n_eval]
        train = rows[n_eval:]
        self._train = train[: self.train_size] if self.train_size else train


def _read_rows(path: Path) -> list[Problem]:
    rows: list[Problem] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or "answer" not in obj:
                raise ValueError(f"{path}:{lineno}: expected an object with string 'prompt' and 'answer'")
            rows.append(Problem(prompt=obj["prompt"], answer=str(obj["answer"])))
    return rows
