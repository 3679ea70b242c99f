"""The engine interface every rollout backend implements (docs/engines.md §6)."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Literal

from mutualrl.models.generation import Sample
from mutualrl.weights import TensorManifest


@dataclass(frozen=True)
class SamplingSpec:
    """Every sampling field, sent explicitly to the engine (docs/engines.md §6)."""
    n: int = 1
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None


@dataclass
class EngineInfo:
    """What an engine reports about itself: backend, versions, log-prob meaning, capabilities."""
    engine: str  # backend name, e.g. "hf"
    engine_version: str
    model: str
    weights_version: int
    logprob_mode: str  # what the returned log-probs mean
    capabilities: dict[str, bool] = field(default_factory=dict)


class RolloutEngine(ABC):
    """Generates groups with behaviour log-probs and swaps weights atomically.

    ``generate`` never runs against a weights version that has not finished
    loading: ``update_weights`` returns only once the new version is served.
    """

    @abstractmethod
    def generate(self, prompts: list[list[int]], spec: SamplingSpec,
                 cancel: threading.Event | None = None) -> list[list[Sample]]:
        """``spec.n`` samples for each prompt, grouped per prompt in prompt order. When ``cancel``
        is set mid-way (the caller went away) the engine stops as soon as it can and raises
        ``GenerationCancelled``."""

    @abstractmethod
    def update_weights(self, version: int, uri: str, checksum: str | None = None,
                       manifest: TensorManifest | None = None) -> None:
        """Load ``version`` from ``uri`` (verifying ``checksum`` when given); returns once it is served.
        A ``collective://`` version comes with the announced ``manifest`` and is taken from the
        learner's broadcast while it runs."""

    @abstractmethod
    def health(self) -> Literal["ok", "starting", "down"]:
        """``ok``, ``starting`` or ``down``."""

    @abstractmethod
    def info(self) -> EngineInfo:
        """What the engine serves: its weights version and backend details."""
