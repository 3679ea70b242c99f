"""The engine interface every rollout backend implements (docs/engines.md §6)."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

from mutualrl.config.engines import EngineFacts
from mutualrl.models.generation import Sample
from mutualrl.weights import TensorManifest

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from mutualrl.config.schema import EngineConfig
    from mutualrl.models.precision import Precision
    from mutualrl.weights import WeightReceiver


@dataclass(frozen=True)
class SamplingSpec:
    """Every sampling field, sent explicitly to the engine (docs/engines.md §6)."""
    n: int = 1
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    # where a completion-form policy's answer ends: an engine may end a completion at the token that completes
    # one (the worker cuts every completion at its first stop string either way, so the rollouts are the same);
    # the hf engine does, the HTTP engines generate to EOS or max_new_tokens
    stop: tuple[str, ...] = ()


@dataclass
class EngineInfo:
    """What an engine reports about itself: backend, versions, log-prob meaning, capabilities."""
    engine: str  # backend name, e.g. "hf"
    engine_version: str
    model: str
    weights_version: int
    logprob_mode: str  # what the returned log-probs mean
    capabilities: dict[str, bool] = field(default_factory=dict)


@dataclass
class EngineSetup:
    """What building a policy's engine starts from: its model and tokenizer (an hf engine samples a copy, a
    server only needs the tokenizer's EOS id), the weight receiver, the served name, and how it is used:
    ``collective`` (a server takes weights from the learner's broadcast, not a directory), ``share`` (hf, in
    the learner's process: sample the learner's module itself), ``precision`` (the policy's), ``adopt`` (hf
    takes ``model`` as its own instead of copying it)."""
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    store: WeightReceiver
    name: str
    collective: bool = False
    share: bool = False
    precision: Precision | None = None
    adopt: bool = False


class RolloutEngine(ABC):
    """Generates groups with behaviour log-probs and swaps weights atomically.

    ``generate`` never runs against a weights version that has not finished
    loading: ``update_weights`` returns only once the new version is served.

    Each engine class declares its :class:`~mutualrl.config.engines.EngineFacts` (``facts``), builds itself
    from a policy's engine config (``from_config``) and, when it is a server, probes one (``probe_config``);
    ``mutualrl.services.rollout.registry`` lists the classes, and ``tests/integration/test_engine_contract.py``
    holds each to this interface.
    """

    facts: ClassVar[EngineFacts]

    @classmethod
    @abstractmethod
    def from_config(cls, cfg: EngineConfig, setup: EngineSetup) -> RolloutEngine:
        """The engine a policy's ``engine`` config names, ready to generate (a server probed: raises
        ``EngineUnavailable`` naming what is missing)."""

    @classmethod
    def probe_config(cls, cfg: EngineConfig) -> dict:
        """Reach the engine a config names before any model work and read its version and capabilities
        (an in-process engine has nothing to reach)."""
        return {"engine": cls.facts.name}

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
