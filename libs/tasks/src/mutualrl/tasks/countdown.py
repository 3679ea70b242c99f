"""Countdown: reach a target with +, -, * over given numbers (each used at most once).

Prompt ``"3 5 7>22:"``; any completion whose arithmetic expression uses a
sub-multiset of the numbers and evaluates to the target is correct, so the
task has many right answers (unlike arithmetic) and the verifier must parse.
"""

from __future__ import annotations

import ast
import random
from collections import Counter

from typing_extensions import override

from mutualrl.tasks.answers import extract_answer
from mutualrl.tasks.base import Problem, Task, Verifier


class CountdownTask(Task):
    """Countdown: reach a target with the given numbers and + - * /; verified by evaluating the expression."""
    name = "countdown"
    answer_format = "last_line"

    def __init__(
        self,
        seed: int = 0,
        train_size: int = 20000,
        eval_size: int = 256,
        num_numbers: int = 3,
        max_number: int = 9,
    ):
        if num_numbers < 2:
            raise ValueError("countdown needs at least 2 numbers")
        if max_number < 1:
            raise ValueError("max_number must be >= 1")
        self.num_numbers, self.max_number = num_numbers, max_number
        super().__init__(seed=seed, train_size=train_size, eval_size=eval_size)

    @override
    def sample(self, rng: random.Random) -> Problem:
        nums = [rng.randint(1, self.max_number) for _ in range(self.num_numbers)]
        # Build a reachable target from a random expression over all numbers, so
        # every problem is solvable; the reference answer is that expression.
        order = nums[:]
        rng.shuffle(order)
        expr = str(order[0])
        for n in order[1:]:
            expr = f"{expr}{rng.choice('+-*')}{n}"
        target = _safe_eval(expr)
        assert target is not None
        prompt = " ".join(map(str, nums)) + f">{target}:"
        return Problem(prompt=prompt, answer=expr, meta={"numbers": nums, "target": target})

    @override
    def default_verifier(self, answer_format: str = "whole") -> Verifier:
        return CountdownVerifier(answer_format)


class CountdownVerifier(Verifier):
    """Accepts any expression over an allowed sub-multiset of the numbers that hits the target."""

    name = "countdown"

    def __init__(self, answer_format: str = "whole"):
        extract_answer("", answer_format)  # an unknown format fails here
        self.answer_format = answer_format

    @override
    def score(self, problem: Problem, completion: str) -> float:
        head, _, tail = problem.prompt.rpartition(">")
        try:
            numbers = Counter(int(x) for x in head.split())
            target = int(tail.rstrip(":"))
        except ValueError:
            return 0.0
        expr = (extract_answer(completion, self.answer_format) or "").strip()
        if not expr or len(expr) > 64 or any(c not in "0123456789+-*() " for c in expr):
            return 0.0
        used = _literals(expr)
        if used is None or any(used[n] > numbers[n] for n in used):
            return 0.0
        value = _safe_eval(expr)
        return 1.0 if value is not None and value == target else 0.0


def _literals(expr: str) -> Counter | None:
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return None
    return Counter(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant))


def _safe_eval(expr: str) -> int | None:
    """Evaluate an integer expression of + - * and parentheses without ``eval``."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return None

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult):
            a, b = ev(node.left), ev(node.right)
            if abs(a) > 10**9 or abs(b) > 10**9:
                raise ValueError("too large")
            return a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"disallowed node {type(node).__name__}")

    try:
        return ev(tree)
    except (ValueError, RecursionError):
        return None
