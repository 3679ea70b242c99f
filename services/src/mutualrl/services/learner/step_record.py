"""One learner step's record: what ``metrics.jsonl``, the Prometheus series, the structured log, the trackers,
the live display and ``mutualrl compare`` know of a step.

The learner fills it (:meth:`Learner.train_step`), the step loop adds what the rest of the step measured
(sampling seconds, the held-out accuracy when due), and every reader in the process names its fields. Its
file form is :meth:`StepRecord.to_dict`, one JSON line per step and policy: the fields below are its columns,
with the extra ones among them (the README's table of a run's files points here). :meth:`StepRecord.from_dict`
reads such a line back (a checkpoint's records, a service's metrics file). Readers of the files themselves
(curves, ``compare``, and the trackers, a library below the services) read those lines as mappings: a file
also holds lines that are not steps (each policy's starting point, ``phase: warm_start``).

Two kinds of field are not typed one by one, on purpose: the sharing modes' own fields (every mode's keys,
None where the step's mode has none, so a metrics file has the same columns whatever the mode) and the
diagnostics of the loss and of the intake, whose set depends on the loss, the mode and the schedule. They
live in :attr:`StepRecord.extra`, by name, in the order they are written.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SampledStep:
    """What the rollout side of the same process measured of a step (the embedded run): the policy's rollouts
    so far, the successes it published for its peers, and the seconds sampling took."""
    rollouts: int
    shared_out: int
    gen_s: float


@dataclass
class StepRecord:
    """One policy's step. A skipped step (no own rollouts before the deadline) carries only its step, policy,
    ``skipped`` and the loop's timing."""

    step: int
    policy: str
    skipped: bool = False
    reward_mean: float = 0.0  # over the step's own rollouts
    loss: float = 0.0  # mean over the step's updates
    kl: float = 0.0  # the loss's KL term, or the approximate KL when the loss has none
    clip_frac: float | None = 0.0
    grad_norm: float | None = None  # None when not finite
    updates: int = 0
    empty_updates: int = 0  # mini-batches with no token to train on
    shared_in: int = 0  # peer rows, statistics and rescues the step used
    peer_rows: int = 0
    own_rollouts: int = 0
    peer_candidates: int = 0  # peer messages offered to the step's intake
    peer_rejected: dict[str, int] = field(default_factory=dict)  # refused peer messages, by reason
    peer_rescored: int = 0
    peers_quarantined: list[str] = field(default_factory=list)
    reputation_events: list[dict] = field(default_factory=list)  # {"peer", "action", "failure_rate"}
    rescue_count: int = 0
    gate_open: int | None = None  # prompts at or under the sharing gate
    signal_groups: int = 0  # own groups whose rewards differ (GRPO's only signal)
    no_signal_steps: int = 0  # steps in a row without one
    thl_residual: float = 0.0
    thl_residual_max: float = 0.0
    thl_logprob_residual: float = 0.0
    thl_length_ratio: float = 1.0
    thl_non_canonical: int = 0
    thl_by_source: dict[str, dict] = field(default_factory=dict)
    weights_version: int = 0
    ratio_mean: float | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)  # wait, logprob, train, weight_sync
    weights_bytes: int = 0
    learner_state_bytes: int = 0
    tokens: int = 0  # completion tokens of the rows trained
    extra: dict[str, Any] = field(default_factory=dict)  # the modes' fields and the diagnostics (module docstring)
    edges: dict[str, dict[str, int]] | None = None  # per incoming edge, when the run records them
    # filled by the step loop
    train_s: float = 0.0  # the learner's seconds (folded into step_s, not written)
    rollouts: int | None = None
    shared_out: int | None = None
    gen_s: float | None = None
    step_s: float | None = None
    wall_time: float | None = None
    eval_accuracy: float | None = None  # held-out accuracy, on steps that evaluated

    def rescue_samples(self) -> int:
        """Completions the policy's own engine sampled in the step's SGT-R rescue round: its rollouts too, counted
        in ``rollouts`` beside its own groups (docs/algorithms.md §3.5)."""
        return int(self.extra.get("rescue_samples") or 0)

    def sampled(self, side: SampledStep | None) -> None:
        """Add what the rollout side measured, and the step's seconds (sampling and training)."""
        if side is not None:
            self.rollouts, self.shared_out, self.gen_s = side.rollouts, side.shared_out, side.gen_s
        self.step_s = (side.gen_s if side is not None else 0.0) + self.train_s

    def to_dict(self) -> dict[str, Any]:
        """The record's line of ``metrics.jsonl``: a skipped step's few fields, or every field of a trained one
        with the extra fields among them; fields the loop did not fill are left out."""
        if self.skipped:
            out: dict[str, Any] = {"step": self.step, "policy": self.policy, "skipped": True}
        else:
            out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in _TRAINED}
            out.update(self.extra)
            if self.edges is not None:
                out["edges"] = self.edges
        for name in _LOOP:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        """A record from its line of ``metrics.jsonl`` (or a checkpoint): known names to their fields, the rest
        to :attr:`extra`."""
        known = {k: v for k, v in data.items() if k in STEP_FIELDS}
        return cls(**known, extra={k: v for k, v in data.items() if k not in STEP_FIELDS})


STEP_FIELDS = frozenset(f.name for f in dataclasses.fields(StepRecord)) - {"extra", "train_s"}
"""The names a record's line gives its typed fields; any other name of the line is an extra field."""
_LOOP = ("rollouts", "shared_out", "gen_s", "step_s", "wall_time", "eval_accuracy")
_TRAINED = STEP_FIELDS - {"skipped", "edges", *_LOOP}


def cross_rows_split(record: Mapping[str, Any]) -> tuple[float, float] | None:
    """A HACPO step's cross rows as (below the ratio's lower bound, not below it), from a record's (or its
    :attr:`StepRecord.extra`'s) ``cross_rows`` and ``cross_discarded_frac`` — the share below, a mean over the cross
    mini-batches. Below the bound the hard clamp leaves a row no gradient (docs/algorithms.md §2.7); it holds a row
    above 1 too, which the records do not count apart, so the second figure is the most rows that trained. None for a
    step without cross rows (another mode, or no peer group complete)."""
    rows, below = record.get("cross_rows"), record.get("cross_discarded_frac")
    if not isinstance(rows, (int, float)) or rows <= 0:
        return None
    n_below = rows * below if isinstance(below, (int, float)) and math.isfinite(below) else 0.0
    return n_below, rows - n_below
