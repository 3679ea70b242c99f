"""One policy's learner, step by step: the sequence every caller drives.

The learner service (single rank, or rank 0 of a sharded learner), the other ranks of a sharded
learner and the embedded run all go through :class:`LearnerLoop`; none of them writes the step
sequence itself. One step is

    train (messages stay unacknowledged) → evaluate, when due → remember what it used (ledger)
    → every ``checkpoint_every`` steps: write the checkpoint atomically, then acknowledge
      everything the steps since the last one used, then hand their records out as durable.

A crash at any instant is recoverable (docs/architecture.md, "The learner loop"): before the
checkpoint, the steps since the last one are redone from the messages still pending; between
checkpoint and acknowledgement, the ledger names the pending messages, which are acknowledged and
never trained again; records the metrics file misses are written from the checkpoint.

A sharded learner's ranks must run the same collectives in the same order: rank 0's loop tells
the others (through :class:`Lockstep`) what it does next — ``resume``, ``step`` (with the
gathered :class:`~mutualrl.services.learner.update.StepInputs`), ``publish``, ``eval``,
``checkpoint``, ``final`` — and :func:`follow_rank0` runs each on the other ranks through the same
loop methods. Without checkpoints (the embedded run) each step is acknowledged at once and its
record is durable immediately.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch

from mutualrl.models.sharding import full_state_dict
from mutualrl.runtime.disk_budget import free_bytes
from mutualrl.runtime.faults import fault_point
from mutualrl.services.learner.learner import Learner
from mutualrl.services.learner.step_record import SampledStep, StepRecord
from mutualrl.tasks import Problem


class Lockstep(Protocol):
    """How rank 0 tells a sharded learner's other ranks what it runs next (they wait for it)."""

    def send(self, command: str, payload=None) -> None:
        """Tell the other ranks the command this rank runs next."""


class SingleRank:
    """The lockstep of a learner with one rank: nobody to tell."""

    def send(self, command: str, payload=None) -> None:
        """Nobody to tell."""
        return None


def rng_state() -> dict:
    """The torch, Python and NumPy random states, for a checkpoint."""
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def restore_rng(state: dict) -> None:
    """Restore the random states :func:`rng_state` saved, so a resumed run draws what an uninterrupted one would."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def save_state(path: Path, state: dict, step: int, policy: str = "") -> None:
    """Write a learner checkpoint atomically: a crash leaves the previous one intact. A write that fails (a full
    disk: torch reports it as "basic_ios::clear: iostream error") says where, how much room is left, and removes
    its partial file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(state, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    except (OSError, RuntimeError) as err:
        tmp.unlink(missing_ok=True)
        free = free_bytes(path.parent) / 2**30
        raise OSError(f"could not write the checkpoint of {policy or 'the learner'} at step {step} to {path} "
                      f"({free:.1f} GiB free on that disk): {err}") from err
    fault_point("during_checkpoint", step, path.parent, policy)  # written, not yet in place
    os.replace(tmp, path)


@dataclass
class Checkpoints:
    """Where and how often one rank checkpoints its learner (``every`` steps and at the last)."""
    path: Path
    every: int

    def due(self, step: int, last: int) -> bool:
        """Whether ``step`` is checkpointed: every ``every`` steps, and the last."""
        return step % self.every == 0 or step == last


@dataclass
class StepOutcome:
    """What one step of the loop gave: its record, and the records now covered by a checkpoint
    (to be written to the metrics file; on a run without checkpoints, the step's own)."""
    record: StepRecord
    durable: list[StepRecord] = field(default_factory=list)
    checkpoint_s: float | None = None  # seconds the step's checkpoint took, when it wrote one


class LearnerLoop:
    """Resume, step, evaluate, checkpoint, publish and finish one policy's learner.

    ``evaluate(model, step)`` is the held-out accuracy (every ``eval_every`` steps and at the last);
    ``checkpoints`` None acknowledges each step at once (nothing to resume from)."""

    def __init__(self, learner: Learner, evaluate: Callable[[torch.nn.Module, int], float], *, steps: int,
                 eval_every: int,
                 checkpoints: Checkpoints | None = None, lockstep: Lockstep | None = None, rank: int = 0):
        self.learner = learner
        self._evaluate = evaluate
        self.steps = steps
        self.eval_every = eval_every
        self.checkpoints = checkpoints
        self.lockstep = lockstep or SingleRank()
        self.rank = rank
        self.policy = learner.policy
        self.ledger: dict[int, dict[str, list[str]]] = {}  # message ids each checkpointed step used
        self.records: list[StepRecord] = []  # every checkpointed step's (replayed into the file on resume)
        self._unsaved: list[StepRecord] = []  # records of the steps since the last checkpoint

    # ---- resume ----------------------------------------------------------
    def resume(self) -> int:
        """Restore the newest checkpoint, if any; the last step it covers (0: a fresh start).
        Rank 0 tells the other ranks, which restore theirs of the same step."""
        done = 0
        cp = self.checkpoints
        if cp is not None and cp.path.is_file():
            st = torch.load(cp.path, weights_only=False)
            self._restore(st)
            self.ledger = st.get("ledger", {})
            self.records = [StepRecord.from_dict(r) for r in st.get("records", [])]
            done = int(st["step"])
            self.learner.consumed = {mid for used in self.ledger.values() for ids in used.values() for mid in ids}
        self.lockstep.send("resume", done)
        return done

    def resume_at(self, step: int) -> None:
        """A follower rank: restore this rank's checkpoint of ``step`` (rank 0 resumed there)."""
        if not step:
            return
        cp = self.checkpoints
        st = torch.load(cp.path, weights_only=False) if cp is not None and cp.path.is_file() else None
        if st is None or st["step"] != step:
            where = cp.path if cp is not None else "(no checkpoint path)"
            raise RuntimeError(f"rank {self.rank} of {self.policy}'s learner has no checkpoint of step {step} at "
                               f"{where} (found {st['step'] if st else 'none'}): the ranks' checkpoints disagree")
        self._restore(st)

    def _restore(self, st: dict) -> None:
        self.learner.load_state_dict(st["learner"])
        restore_rng(st["rng"])

    # ---- one step --------------------------------------------------------
    def step(self, step: int, problems: list[Problem], rollout: SampledStep | None = None,
             while_waiting=None) -> StepOutcome:
        """Train one step (and evaluate and checkpoint when due). ``rollout`` is what the rollout side
        measured in the same process (the embedded run), added to the record; its sampling seconds count
        in the step's."""
        learner = self.learner
        rec = learner.train_step(step, problems, commit=self.checkpoints is None,
                                 before_update=lambda inputs: self.lockstep.send("step", inputs),
                                 while_waiting=while_waiting)
        rec.sampled(rollout)
        rec.wall_time = time.time()
        if not rec.skipped and (step % self.eval_every == 0 or step == self.steps):
            self.lockstep.send("eval")
            rec.eval_accuracy = self.evaluate(step)
        self.ledger[step] = learner.last_used if not rec.skipped else {"own": [], "peer": []}
        self._unsaved.append(rec)
        if self.checkpoints is None:
            return StepOutcome(rec, self._take_unsaved())
        fault_point("before_checkpoint", step, self.checkpoints.path.parent, self.policy)
        if not self.checkpoints.due(step, self.steps):
            return StepOutcome(rec)
        t0 = time.monotonic()
        self.lockstep.send("checkpoint", step)
        self.checkpoint(step)
        checkpoint_s = time.monotonic() - t0
        fault_point("after_checkpoint", step, self.checkpoints.path.parent, self.policy)
        learner.commit()  # every message of the steps since the last checkpoint
        fault_point("after_ack", step, self.checkpoints.path.parent, self.policy)
        return StepOutcome(rec, self._take_unsaved(), checkpoint_s)

    def _take_unsaved(self) -> list[StepRecord]:
        durable, self._unsaved = self._unsaved, []
        self.records += durable
        return durable

    def apply(self, inputs) -> None:
        """A follower rank's share of a step: the same update and weights gathering as rank 0's."""
        self.learner.updater.apply(inputs, {"logprob": 0.0})
        self.learner.publish_weights(inputs.step)  # every rank gathers; rank 0 publishes

    def evaluate(self, step: int = 0) -> float:
        """Held-out accuracy of the learner's current weights (at ``step``)."""
        return self._evaluate(self.learner.model, step)

    def checkpoint(self, step: int) -> None:
        """This rank's checkpoint of ``step`` (rank 0's also holds the ledger and the records)."""
        state = {"learner": self.learner.state_dict(), "step": step, "rng": rng_state()}
        if self.rank == 0:
            state.update(ledger=self.ledger, records=[r.to_dict() for r in self.records + self._unsaved])
        save_state(self.checkpoints.path, state, step, self.policy)

    def publish(self, step: int) -> None:
        """Publish the current weights as a new version (every rank gathers)."""
        self.lockstep.send("publish", step)
        self.learner.publish_weights(step)

    # ---- the end ---------------------------------------------------------
    def finish(self) -> tuple[torch.nn.Module, torch.optim.Optimizer | None]:
        """The model and optimiser to save once the budget is done: a sharded model is gathered
        into an unsharded copy (a collective: every rank takes part), its optimiser stays in the
        ranks' checkpoints."""
        self.lockstep.send("final")
        model = self.learner.model
        if not self.learner.sharded:
            return model, self.learner.updater.opt
        whole = full_state_dict(model)
        if self.rank != 0:
            return model, None
        copy = type(model)(model.config)
        copy.load_state_dict(whole)
        return copy, None


def follow_rank0(loop: LearnerLoop, receive: Callable[[], tuple[str, object]]) -> None:
    """Rank k > 0 of a sharded learner: run rank 0's commands through the same loop until it says stop."""
    actions: dict[str, Callable[[object], object]] = {
        "resume": loop.resume_at,
        "step": loop.apply,
        "publish": loop.learner.publish_weights,
        "eval": lambda _: loop.evaluate(),
        "checkpoint": loop.checkpoint,
        "final": lambda _: loop.finish(),
    }
    while True:
        command, payload = receive()
        if command == "stop":
            return
        if command not in actions:
            raise RuntimeError(f"unknown command {command!r} from rank 0")
        actions[command](payload)
