"""Verifiable tasks: procedural generators with seeded splits, and exact verifiers.

A task yields :class:`Problem` objects (prompt text + reference answer); a
:class:`Verifier` scores a completion against a problem with a binary reward.
Rewards are computed on the rollout side and re-checked by any receiver of a
peer's claimed success (a peer is never trusted blindly: docs/algorithms.md §3.2), so
verifiers are pure, deterministic and cheap.
"""

from mutualrl.tasks.base import Problem, Task, Verifier
from mutualrl.tasks.registry import TASKS, VERIFIERS, build_task, build_verifier

__all__ = ["Problem", "Task", "Verifier", "build_task", "build_verifier", "TASKS", "VERIFIERS"]
