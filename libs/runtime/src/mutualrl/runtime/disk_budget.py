"""Whether a run's directory can hold what the run will write, checked before it trains.

A run of real models writes its learners' whole state to disk: the final checkpoint of every policy (weights and
AdamW's two moments, ~12 bytes a parameter in fp32) and, with ``checkpoint.resume_every``, resume points of the
same size. A `mutualrl compare` keeps every finished run's final checkpoints, so its directory grows by that much a
run: a pair of Gemma-3-270M and SmolLM2-135M writes 4.6 GB a run, and after a dozen such runs on one disk the next
found it full at its second resume point, eight minutes in. Checked once the models are loaded and before anything is
evaluated or trained, the same shortage is a one-line error that costs nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from mutualrl.config import ConfigError


class NotEnoughDisk(ConfigError):
    """The disk under a run's directory has less free space than the run will write (a one-line error, as a bad
    config is: nothing was trained)."""

    def __init__(self, message: str, need: int, free: int):
        super().__init__(message)
        self.need, self.free = need, free

    def __reduce__(self):  # raised in a `compare --jobs N` worker process, it is pickled back whole
        return type(self), (str(self), self.need, self.free)


def learner_state_bytes(model: torch.nn.Module, moment_bytes: int | None = None) -> int:
    """Bytes of one learner's state as a checkpoint or a resume point holds it: every parameter, and AdamW's two
    moments for each parameter that trains. ``moment_bytes``: a moment's element size (2 for ``optim.state_dtype:
    bfloat16``); None: the parameter's own. Before the first update the optimiser holds no moments yet, so they are
    counted from the parameters rather than measured (the learner's ``state_bytes`` measures them afterwards)."""
    total = 0
    for p in model.parameters():  # a tied head is one parameter, counted once
        total += p.numel() * p.element_size()
        if p.requires_grad:
            total += 2 * p.numel() * (moment_bytes or p.element_size())
    return total


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's parameters as a weights version holds them (a tied head once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def weight_store_need(weights_bytes: int, keep: int, resumed: bool) -> int:
    """The most a policy's versions add to the filesystem weight store at once: the ``keep`` newest ones an engine
    may still load, and the one being written before the older ones go. A resumed run's store holds its kept
    versions already, so it adds the one being written."""
    return weights_bytes if resumed else (keep + 1) * weights_bytes


def moment_bytes(state_dtype: str) -> int | None:
    """A moment's element size for ``optim.state_dtype`` (None: the parameter's own, for float32)."""
    return 2 if state_dtype == "bfloat16" else None


def service_disk_need(state_bytes: int, resumed: bool) -> int:
    """The most one learner service adds to its run's directory at once, given its learner's state.

    A service writes its state file at every ``checkpoint.every`` steps *and at the last step*, each one whole
    beside the one before, and then the final checkpoint beside the last state file: two copies at once, whatever
    ``checkpoint.every`` is. A resumed service's state file is on disk already, so it adds one copy."""
    return state_bytes if resumed else 2 * state_bytes


def run_disk_need(state_bytes: int, resume_every: int, steps: int, resumed: bool) -> int:
    """The most a run adds to its directory at once, given its learners' state (``state_bytes``, all policies).

    Its final checkpoints are one copy of that state. With resume points there is a second: a resume point is
    written whole beside the one before it and then replaces it, and the last one stays until the final
    checkpoints are written. A resumed run's directory holds one resume point already, so it adds one copy.
    Resume points are written after steps ``resume_every``, ``2·resume_every``, … before the last step."""
    if resumed:
        return state_bytes
    return (2 if resume_every > 0 and steps > resume_every else 1) * state_bytes


def size_text(n: int | float) -> str:
    """Bytes as GiB, or as MiB under one GiB (a tiny model's checkpoint would read as 0.0 GiB)."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def free_bytes(directory: Path) -> int:
    """Free bytes on the disk that holds ``directory`` (or its nearest existing parent: a run's directory is made
    when the run starts)."""
    d = directory.resolve()
    while not d.exists() and d != d.parent:
        d = d.parent
    return shutil.disk_usage(d).free


RUN_REMEDY = ("Free space (a finished run's checkpoints/ folder: reports read only its records), give --out on "
              "another disk, or set checkpoint.resume_every: 0 to write no resume points")
"""What to do, for `mutualrl run` and `compare` (an embedded run)."""

SERVICE_REMEDY = ("Free space (a finished run's checkpoints/ folder), give --out on another disk, or (Helm) "
                  "a larger state.size")
"""What to do, for `mutualrl up` and a learner service: its checkpoints are how it resumes, so none can be left out."""


def check_room(directory: Path, need: int, what: str, remedy: str = RUN_REMEDY) -> None:
    """Raise :class:`NotEnoughDisk` when ``directory``'s disk has less than ``need`` bytes free; ``what`` says what
    the bytes are for, ``remedy`` what to do."""
    free = free_bytes(directory)
    if free < need:
        raise NotEnoughDisk(f"{directory} needs {size_text(need)} free for {what}; its disk has {size_text(free)}. "
                            f"{remedy}", need, free)
