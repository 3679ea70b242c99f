"""Verifiers: exact match and a ``math-verify`` checker that is safe off the main thread."""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import multiprocessing as mp
import threading

from typing_extensions import override

from mutualrl.tasks.answers import extract_answer, normalise_number
from mutualrl.tasks.problem import Problem, Verifier


class ExactMatchVerifier(Verifier):
    """Reward 1 iff the completion, stripped of surrounding whitespace, equals the answer."""

    name = "exact"

    @override
    def score(self, problem: Problem, completion: str) -> float:
        return 1.0 if completion.strip() == problem.answer.strip() else 0.0


class ExtractedAnswerVerifier(Verifier):
    """Reward 1 iff the answer extracted in ``answer_format`` (tasks.answers) equals the reference:
    "The answer is 19." scores 1 on ``19`` under ``last_number``, where whole matching gives 0."""

    name = "answer"

    def __init__(self, answer_format: str):
        extract_answer("", answer_format)  # an unknown format fails here, not at the first rollout
        self.answer_format = answer_format
        self.version = answer_format

    @override
    def score(self, problem: Problem, completion: str) -> float:
        got = extract_answer(completion, self.answer_format)
        if got is None:
            return 0.0
        want = normalise_number(problem.answer) if self.answer_format == "last_number" else problem.answer.strip()
        return 1.0 if got == want else 0.0


def answer_verifier(answer_format: str) -> Verifier:
    """Whole-completion matching (today's exact verifier) or extraction in ``answer_format``."""
    return ExactMatchVerifier() if answer_format == "whole" else ExtractedAnswerVerifier(answer_format)


def _math_verify(answer: str, completion: str) -> bool:
    # Runs in a worker process: math-verify's own timeouts use signal.alarm,
    # which only works in a main thread, so they are disabled and the parent
    # bounds time with the future's timeout instead.
    from math_verify import parse, verify

    gold = parse(answer, parsing_timeout=None)
    pred = parse(completion, parsing_timeout=None)
    return bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=None))


class MathVerifier(Verifier):
    """Free-form math answers (``\\boxed{}``, LaTeX, plain numbers) via ``math-verify``.

    Each check runs in a small process pool and is abandoned after
    ``timeout_s``: pathological inputs (huge exponents, deep nesting) cost a
    zero reward instead of a hung rollout worker, and the verifier can be
    called from any thread.
    """

    name = "math"

    def __init__(self, timeout_s: float = 5.0, workers: int = 1):
        try:
            import math_verify  # noqa: F401
        except ImportError as e:  # pragma: no cover - dependency is declared
            raise RuntimeError("the 'math' verifier needs the math-verify package") from e
        self.timeout_s = timeout_s
        self.workers = workers
        self._pool: cf.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        atexit.register(self.close)

    def _get_pool(self) -> cf.ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"))
            return self._pool

    @override
    def score(self, problem: Problem, completion: str) -> float:
        return self.score_many([problem], [completion])[0]

    @override
    def score_many(self, problems: list[Problem], completions: list[str]) -> list[float]:
        if len(problems) != len(completions):
            raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
        pool = self._get_pool()
        futures = [pool.submit(_math_verify, p.answer, c) for p, c in zip(problems, completions)]
        scores: list[float] = []
        broken = False
        for fut in futures:
            try:
                scores.append(1.0 if fut.result(timeout=self.timeout_s) else 0.0)
            except cf.TimeoutError:
                scores.append(0.0)
                broken = True  # the worker may be stuck; replace the pool
            except Exception:
                scores.append(0.0)
        if broken:
            self.close()
        return scores

    def close(self) -> None:
        """Stop the worker process that runs math-verify."""
        with self._lock:
            if self._pool is not None:
                for p in list(getattr(self._pool, "_processes", {}).values()):
                    p.kill()
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
