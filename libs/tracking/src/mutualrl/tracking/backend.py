"""The one interface every tracker adapter implements, and what it is told about the run it logs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class RunInfo:
    """One policy's tracked run inside an experiment.

    ``group`` ties the policies of one run together across processes: the SEE namespace of a service
    deployment (every learner knows it), a fresh id for an embedded run. ``tags`` are the strings a
    tracker filters by (experiment, policy, model, tokenizer, sharing, seed, version, and a compare's
    entry/pair); ``params`` the resolved config, flat."""
    experiment: str
    policy: str
    group: str
    run_dir: Path
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str | int | float | bool] = field(default_factory=dict)
    config_yaml: str = ""


class Backend(Protocol):
    """A tracker adapter. Its methods are called from one worker thread only, in order; any of them may
    raise (the guard around it counts, warns and retries), and ``open`` may be called again after a failure."""

    name: str

    def open(self) -> None:
        """Create or find the run; log the config, parameters and tags."""

    def log(self, step: int, values: dict[str, float]) -> None:
        """Scalars at one x (a step, or rollouts for ``by_rollouts/`` names)."""

    def log_many(self, points: list[tuple[int, dict[str, float]]]) -> None:
        """Several ``(x, scalars)`` at once (what waited while the last call was made)."""
        for step, values in points:
            self.log(step, values)

    def finish(self, summary: dict[str, float]) -> None:
        """The final numbers; mark the run finished and release it."""
