"""Multi-digit integer arithmetic: ``"123+45="`` -> ``"168"``."""

from __future__ import annotations

import random

from typing_extensions import override

from mutualrl.tasks.base import Problem, Task


class ArithmeticTask(Task):
    """Addition/subtraction/multiplication of random integers.

    ``min_digits``/``max_digits`` bound each operand's digit count; the answer is
    the exact integer result. Difficulty is set by digits and operators, so the
    same generator serves a quick demo (2 digits, ``+``) and harder comparisons.
    """

    name = "arithmetic"
    answer_format = "last_number"

    def __init__(
        self,
        seed: int = 0,
        train_size: int = 20000,
        eval_size: int = 256,
        min_digits: int = 1,
        max_digits: int = 2,
        operators: str = "+",
    ):
        if not 1 <= min_digits <= max_digits:
            raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
        bad = set(operators) - set("+-*")
        if not operators or bad:
            raise ValueError(f"operators must be a non-empty subset of '+-*', got {operators!r}")
        self.min_digits, self.max_digits, self.operators = min_digits, max_digits, operators
        super().__init__(seed=seed, train_size=train_size, eval_size=eval_size)

    def _operand(self, rng: random.Random) -> int:
        d = rng.randint(self.min_digits, self.max_digits)
        return rng.randint(0 if d == 1 else 10 ** (d - 1), 10**d - 1)

    @override
    def sample(self, rng: random.Random) -> Problem:
        a, b = self._operand(rng), self._operand(rng)
        op = rng.choice(self.operators)
        value = a + b if op == "+" else a - b if op == "-" else a * b
        return Problem(prompt=f"{a}{op}{b}=", answer=str(value))
