"""An in-process engine whose torch work runs on the service's main thread, whichever thread asks for it.

A rollout service's weights follower, rescue responder and gRPC handlers run on threads of their own. If they ran
the engine there, each would keep an OpenMP team of its own, and the main thread's generations would run ~25 %
slower from then on (mutualrl.runtime.owner_thread says why). Through this wrapper their ``generate`` and
``update_weights`` calls are handed to the main thread, which runs them while it waits; the main thread's own calls
run at once."""

from __future__ import annotations

import threading

from mutualrl.models.generation import Sample
from mutualrl.runtime.owner_thread import OwnerThread
from mutualrl.services.rollout.engine import RolloutEngine, SamplingSpec
from mutualrl.weights import TensorManifest


class OwnedEngine:
    """``engine`` with ``generate`` and ``update_weights`` run on ``owner``'s thread; every other attribute is the
    engine's own."""

    def __init__(self, engine: RolloutEngine, owner: OwnerThread):
        self.engine, self.owner = engine, owner

    def generate(self, prompts: list[list[int]], spec: SamplingSpec,
                 cancel: threading.Event | None = None) -> list[list[Sample]]:
        """The engine's ``generate``, on the owner thread."""
        return self.owner.call(self.engine.generate, prompts, spec, cancel)

    def update_weights(self, version: int, uri: str, checksum: str | None = None,
                       manifest: TensorManifest | None = None) -> None:
        """The engine's ``update_weights``, on the owner thread."""
        return self.owner.call(self.engine.update_weights, version, uri, checksum, manifest)

    def __getattr__(self, name: str):
        return getattr(self.engine, name)
