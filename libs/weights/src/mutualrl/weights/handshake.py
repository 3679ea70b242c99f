"""The weights handshake between a learner and its rollout side, both halves in one place.

The learner's :class:`WeightsPublisher` numbers versions, publishes each through its transport's
sending half (which orders write and announcement: docs/architecture.md, "Weights") and answers a
rollout side that asks again. The rollout side's :class:`WeightsFollower` loads every version its
learner announces, once, into its engine, acknowledges it to the transport's receiving half (old
versions may then go), and counts and logs a refused one (the engine keeps serving the one before).

Two facts shape the protocol:

- **Versions never repeat.** A restarted learner continues after the newest version it announced
  (:meth:`WeightsPublisher.continue_after`), since rollout servers may already serve a version
  newer than the learner's checkpoint.
- **A collective version is gone once sent.** A rollout service that (re)joined after a version was
  broadcast cannot load it; it asks again with an ``awaiting_weights`` heartbeat and samples
  nothing meanwhile, and the learner sends its current weights as a new version, once per request
  (:meth:`WeightsPublisher.asked_again`). A version still to be broadcast is recognised by the
  learner's heartbeat: the learner announces, broadcasts (waiting for every receiver) and only
  then heartbeats.
- **A delta needs its base.** A version sent as the changes since the one before it
  (:mod:`mutualrl.weights.deltas`) can be rebuilt only on that one; a rollout side that does not serve
  it (restarted, or it skipped a version) asks again the same way, and the learner's next version goes
  whole (:meth:`WeightsPublisher.send_whole_next`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from mutualrl.see import ExperienceExchange, Received
from mutualrl.v1 import experience_pb2 as pb
from mutualrl.weights.transport import (
    NeedsFullVersion,
    TensorManifest,
    VersionSuperseded,
    WeightReceiver,
    WeightSender,
)

AWAITING_WEIGHTS = "awaiting_weights"
"""The heartbeat status of a rollout service that missed a broadcast version and waits for it again."""


def learner_stream(policy: str) -> str:
    """The SEE producer name of a policy's learner."""
    return f"{policy}.learner"


def rollout_stream(policy: str) -> str:
    """The SEE producer name of a policy's rollout service."""
    return f"{policy}.rollout"


def newest_announced(exchange: ExperienceExchange, policy: str) -> int:
    """The newest weights version ``policy``'s learner announced (0 before the first)."""
    wp = exchange.last("weights_published", policy)
    return int(wp.payload.version) if wp is not None else 0


class WeightsPublisher:
    """The learner's half: versions, announcements and answers to a rollout side that asks again."""

    def __init__(self, policy: str, exchange: ExperienceExchange, sender: WeightSender, model_config=None):
        self.policy = policy
        self.ex = exchange
        self.sender = sender
        # a filesystem version is a complete Hugging Face checkpoint (what vLLM and SGLang reload)
        self.model_config = model_config if getattr(sender, "root", None) else None
        self.version = 0

    def publish(self, step: int, state: dict[str, torch.Tensor]) -> int:
        """Publish ``state`` as the next version; returns it. The transport writes then announces
        (filesystem) or announces then broadcasts (collective)."""
        self.version += 1
        version = self.version

        def announce(uri: str, checksum: str, manifest: TensorManifest | None) -> None:
            self.ex.publish(pb.WeightsPublished(policy=self.policy, version=version, uri=uri, step=step,
                                                checksum=checksum,
                                                tensors=manifest.to_proto() if manifest is not None else []),
                            self.policy, version)

        self.sender.publish(self.policy, version, state, announce, model_config=self.model_config)
        return version

    def send_whole_next(self) -> None:
        """The next version goes whole: a rollout side asked again because it lacks a delta's base
        (a transport without deltas sends every version whole anyway)."""
        reset = getattr(self.sender, "reset", None)
        if reset is not None:
            reset()

    def continue_after(self) -> int:
        """After a restart: continue after the newest version announced (never one twice)."""
        self.version = max(self.version, newest_announced(self.ex, self.policy))
        return self.version

    def asked_again(self) -> bool:
        """Whether the rollout side asks for the weights again: an ``awaiting_weights`` heartbeat,
        serving an older version than ours, newer than our newest announcement (an older request
        was answered by it)."""
        hb = self.ex.last("heartbeat", rollout_stream(self.policy))
        if hb is None or hb.payload.status != AWAITING_WEIGHTS or hb.payload.version >= self.version:
            return False
        wp = self.ex.last("weights_published", self.policy)
        return wp is None or wp.envelope.created_unix_nanos <= hb.envelope.created_unix_nanos


Load = Callable[[int, str, "str | None", "TensorManifest | None"], None]
"""``load(version, uri, checksum, manifest)``: the engine takes a version (raises ValueError or
RuntimeError to refuse it: a wrong checksum, weights that do not fit, a broken broadcast)."""


@dataclass
class WeightsFollower:
    """The rollout side's half: load each announced version once, ask again for a missed one.

    ``load`` puts a version into the engine, ``served()`` is the version it serves; ``on_loaded``
    and ``on_refused`` (version, error) let the caller count and show what happened."""

    policy: str
    exchange: ExperienceExchange
    receiver: WeightReceiver
    load: Load
    served: Callable[[], int]
    collective: bool = field(default=False, kw_only=True)
    log: logging.Logger | None = field(default=None, kw_only=True)
    on_loaded: Callable[[int], None] | None = field(default=None, kw_only=True)
    on_refused: Callable[[int, Exception], None] | None = field(default=None, kw_only=True)
    handled: int = field(default=0, init=False)  # the newest announced version loaded or refused
    superseded: int = field(default=0, init=False)  # the newest version gone before it could be loaded
    last_load_s: float = field(default=0.0, init=False)  # how long the last loaded version took (metrics)
    asked: int = field(default=0, init=False)  # the missed version asked for again
    _error: BaseException | None = field(default=None, init=False)
    _steps: dict[int, int] = field(default_factory=dict, init=False)  # version loaded -> the step it was published at

    def __post_init__(self) -> None:
        self.log = self.log or logging.getLogger(f"mutualrl.weights.{self.policy}")

    def newest_announced(self) -> int:
        """The newest version this policy's learner announced (0 before any)."""
        return newest_announced(self.exchange, self.policy)

    def load_newest(self) -> None:
        """Load the newest announced version, unless it was handled or is served already."""
        wp = self.exchange.last("weights_published", self.policy)
        if wp is None:
            return
        version = int(wp.payload.version)
        if version <= max(self.handled, self.served(), self.superseded):
            return
        if self.collective and not self._broadcast_pending(wp):
            # announced before this service joined and already sent: sampling now would use older
            # weights than the staleness bound allows, so ask the learner to send them again
            self._ask_again(version, "broadcast before this service started")
            return
        t0 = time.monotonic()
        try:
            self.load(version, wp.payload.uri, wp.payload.checksum or None,
                      TensorManifest.from_proto(wp.payload.tensors))
        except NeedsFullVersion as e:
            # a delta whose base this engine never loaded: the learner is asked for the weights whole, and
            # until they load the service is behind (nothing sampled with what it has)
            self.superseded = version
            self._ask_again(version, f"cannot be rebuilt here ({e})")
            return
        except VersionSuperseded as e:
            # replaced by a newer version, whose announcement follows: not handled, so the service stays behind
            # (caught_up() is False) and samples nothing with the weights it has until that one is loaded
            self.log.info("weights version superseded while loading", extra={"fields": {"version": version,
                                                                                       "detail": str(e)}})
            self.superseded = version
            return
        except (ValueError, RuntimeError) as e:
            if self.served() < version:
                self.log.error("weights refused", extra={"fields": {"version": version, "error": str(e)}})
                if self.on_refused is not None:
                    self.on_refused(version, e)
        else:
            self.last_load_s = time.monotonic() - t0
            self._steps[version] = int(wp.payload.step)
            self.receiver.acknowledge(self.policy, version)
            self.log.info("weights loaded", extra={"fields": {"version": version}})
            if self.on_loaded is not None:
                self.on_loaded(version)
        self.handled = max(self.handled, version)

    def _broadcast_pending(self, wp: Received) -> bool:
        hb = self.exchange.last("heartbeat", learner_stream(self.policy))
        return hb is None or wp.envelope.created_unix_nanos > hb.envelope.created_unix_nanos

    def _ask_again(self, version: int, why: str) -> None:
        if self.asked == version:
            return
        self.log.warning(f"weights version missed ({why}): asking the learner to send the weights again",
                         extra={"fields": {"version": version}})
        own = self.exchange.last("heartbeat", rollout_stream(self.policy))
        step = int(own.payload.step) if own is not None else 0
        self.exchange.publish(pb.Heartbeat(role="rollout", step=step, version=self.served(), status=AWAITING_WEIGHTS),
                        rollout_stream(self.policy))
        self.asked = version

    def served_step(self) -> int:
        """The learner step whose weights the engine serves (0: the starting weights, or a version this follower
        never saw announced)."""
        version = self.served()
        if version in self._steps:
            return self._steps[version]
        wp = self.exchange.last("weights_published", self.policy)
        return int(wp.payload.step) if wp is not None and int(wp.payload.version) == version else 0

    def caught_up(self) -> bool:
        """Whether the newest announced version is loaded (or was refused; one superseded before it
        could be loaded does not count: its successor is awaited). Raises when the
        following thread failed (a broken weight group: the service exits and is restarted)."""
        self.check()
        return max(self.handled, self.served()) >= self.newest_announced()

    def follow(self, stop: threading.Event) -> threading.Thread:
        """Load every version as it is announced, on a thread of its own: a collective version must
        be taken while the learner broadcasts it. Woken by each announcement (a blocking read of
        the learner's weights stream), not by polling."""
        announcements = self.exchange.subscribe(f"{self.policy}-rollout-weights", ["weights_published"], [self.policy],
                                          consumer=f"{self.policy}-rollout")

        def run() -> None:
            try:
                while not stop.is_set():
                    self.load_newest()
                    got = announcements.poll(block_ms=250)
                    if got:
                        announcements.ack(got)
            except BaseException as e:  # noqa: BLE001 - surfaced by caught_up() and check()
                self._error = e
                stop.set()

        thread = threading.Thread(target=run, name="weights-follower", daemon=True)
        thread.start()
        return thread

    def check(self) -> None:
        """Raise the following thread's failure, if it had one."""
        if self._error is not None:
            raise RuntimeError(f"weights follower failed: {self._error}") from self._error
