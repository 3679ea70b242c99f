"""Which share of a step's prompts this rollout replica samples.

A policy's rollout may run as several replicas (MWRA adds them; the chart's static StatefulSet runs
``rollout.replicas``). Every replica follows the same step schedule and the same prompt order; replica i of n
samples prompts i, i+n, i+2n, ... of each step, so together they sample each prompt exactly once and the
learner sees the step's groups as if one service had sampled them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Sequence, TypeVar

REPLICA_ENV = "MUTUALRL_ROLLOUT_REPLICA"
REPLICAS_ENV = "MUTUALRL_ROLLOUT_REPLICAS"

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    """Replica ``index`` of ``count``."""

    index: int = 0
    count: int = 1

    def take(self, items: Sequence[T]) -> list[T]:
        """This replica's share of a step's prompts."""
        return list(items[self.index::self.count])

    @property
    def suffix(self) -> str:
        """A name part that tells replicas apart ('' for a single one)."""
        return f"-{self.index}" if self.count > 1 else ""


def shard_from_env(env: Mapping[str, str] = os.environ) -> Shard:
    """The replica's shard from MUTUALRL_ROLLOUT_REPLICA and MUTUALRL_ROLLOUT_REPLICAS (default: the only one).

    Raises ValueError with the variables' values when they do not name a replica of the count.
    """
    raw_i, raw_n = env.get(REPLICA_ENV, "0") or "0", env.get(REPLICAS_ENV, "1") or "1"
    try:
        i, n = int(raw_i), int(raw_n)
    except ValueError:
        raise ValueError(f"{REPLICA_ENV}={raw_i!r} and {REPLICAS_ENV}={raw_n!r} must be integers") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"{REPLICA_ENV}={i} is not a replica of {REPLICAS_ENV}={n} (0 <= replica < replicas)")
    return Shard(i, n)
