"""Task and verifier registries keyed by name; unknown names list the valid ones."""

from __future__ import annotations

from typing import Any, Callable

from mutualrl.tasks.arithmetic import ArithmeticTask
from mutualrl.tasks.base import Task, Verifier
from mutualrl.tasks.countdown import CountdownTask, CountdownVerifier
from mutualrl.tasks.jsonl import JsonlTask
from mutualrl.tasks.reasoning_gym_task import ReasoningGymTask
from mutualrl.tasks.verifiers import ExactMatchVerifier, MathVerifier

TASKS: dict[str, Callable[..., Task]] = {
    "arithmetic": ArithmeticTask,
    "countdown": CountdownTask,
    "jsonl": JsonlTask,
    "reasoning_gym": ReasoningGymTask,
}

VERIFIERS: dict[str, Callable[..., Verifier]] = {
    "exact": ExactMatchVerifier,
    "math": MathVerifier,
    "countdown": CountdownVerifier,
}


def build_task(name: str, **kwargs: Any) -> Task:
    """The task registered under ``name``, built with ``kwargs`` (the error lists the valid names)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid: {', '.join(sorted(TASKS))}")
    return TASKS[name](**kwargs)


def missing_packages(name: str) -> list[str]:
    """The pip requirements of task ``name`` that are not installed (empty for an unknown name: building it says
    so)."""
    import importlib.util

    task = TASKS.get(name)
    reqs = getattr(task, "requirements", ())
    def absent(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is None
        except (ImportError, ValueError):  # a module that was there and is gone, or a broken install
            return True

    return [req for req, module in reqs if absent(module)]


def build_verifier(name: str | None, task: Task, answer_format: str = "whole") -> Verifier:
    """The named verifier, or the task's default for answers in ``answer_format`` when ``name`` is None/'default'."""
    if name in (None, "default"):
        return task.default_verifier(answer_format)
    if name not in VERIFIERS:
        raise ValueError(f"unknown verifier {name!r}; valid: default, {', '.join(sorted(VERIFIERS))}")
    return VERIFIERS[name]()
