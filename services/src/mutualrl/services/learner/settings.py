"""A learner's settings: what it takes from the experiment's algorithm, sharing, optimiser and async sections."""

from __future__ import annotations

from dataclasses import dataclass, field

from mutualrl.config import AlgorithmConfig, SharingConfig
from mutualrl.config.schema import AsyncConfig, OptimConfig
from mutualrl.models.precision import Precision, resolve_precision


@dataclass
class LearnerSettings:
    """The learner's algorithm settings, taken from the experiment's algorithm and sharing sections."""
    group_size: int
    algorithm: AlgorithmConfig
    sharing: SharingConfig
    optim: OptimConfig
    max_new_tokens: int = 8
    device: str = "cpu"
    peer_deadline_s: float = 30.0  # how long to wait for own experience before training on what arrived
    staleness: AsyncConfig = field(default_factory=AsyncConfig)  # pipelined sampling: the decoupled objective (§6)
    record_edges: bool = False  # a sharing graph: each record has an ``edges`` field
    temperature: float = 1.0  # the engine's sampling temperature: π_θ is computed at it, as π_old was (§1.1)
    no_signal_warn_steps: int = 3  # K: WARNING after K consecutive steps without a mixed-reward own group
    precision: Precision = field(default_factory=lambda: resolve_precision("float32", pretrained=False,
                                                                           device="cpu"))  # model.dtype (§7.1)
    behaviour_correction: bool = False  # the decoupled objective without pipelining: the sampler's numbers differ
    behaviour_gap_bound: float | None = None  # auto: the p99 gap (nats) past which the correction turns on
    gradient_checkpointing: bool = False  # model.gradient_checkpointing
    # give an update's freed pages back to the host: a learner beside other processes (`up`, a pod); not where one
    # process holds every policy (`run`), whose next update would fault them in again (mutualrl.runtime.memory)
    return_freed_memory: bool = True
    # ... and only when the share of memory still free to it is under this (mutualrl.runtime.memory.free_memory_share):
    # a trim with memory to spare costs the next update its page faults and frees nothing anyone needs (None: always)
    trim_when_free_below: float | None = 0.5
