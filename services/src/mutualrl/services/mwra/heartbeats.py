"""Measured step costs for the controller, read from the services' own heartbeats.

Every rollout and learner service publishes a heartbeat per step on SEE with the seconds each
stage took (``generate``; ``logprob``, ``train``, ``weight_sync``). The controller needs exactly
those numbers to replace its seeded costs, so it follows the heartbeat streams of every running
experiment through a consumer group of its own (``mwra``) and hands each step to
``Controller.report_step``. Nothing else has to call the step API in a deployment.

A heartbeat is trusted only as far as SEE trusts it: it must decode and verify (HMAC when the
run signs), sit on its producer's own stream, and name the role that stream belongs to;
anything else is counted as rejected and acknowledged so it is not read again.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

from mutualrl.see import ExperienceExchange
from mutualrl.see.exchange import Subscription

ROLES = ("rollout", "learner")
GROUP = "mwra"


class HeartbeatFollower:
    """Polls the heartbeats of every running experiment of ``controller``.

    ``connect(exp)`` returns the SEE exchange the experiment's services publish on (its namespace
    is the run id) or None when the controller cannot reach it; it is asked once per experiment.
    """

    def __init__(self, controller, connect: Callable[[object], ExperienceExchange | None]):
        self.controller = controller
        self.connect = connect
        self._subs: dict[str, Subscription | None] = {}
        self.counts: Counter[str] = Counter()

    def _subscription(self, exp) -> Subscription | None:
        if exp.id not in self._subs:
            ex = self.connect(exp)
            producers = [f"{p.name}.{role}" for p in exp.config.policies for role in ROLES]
            self._subs[exp.id] = ex.subscribe(GROUP, ["heartbeat"], producers,
                                              consumer="controller") if ex is not None else None
        return self._subs[exp.id]

    def poll_once(self, block_ms: int | None = None) -> int:
        """Feed every new heartbeat to the controller; returns how many were measurements."""
        fed = 0
        if not self.controller.leading:
            return 0  # a standby reads nothing: the leader's group consumes the measurements
        with self.controller.lock:
            running = [e for e in self.controller.experiments.values() if e.status == "running"]
        for exp in running:
            sub = self._subscription(exp)
            if sub is None:
                continue
            received = sub.poll(block_ms=block_ms)
            for r in received:
                env = r.envelope
                producer = r.entry.stream.rsplit(":", 1)[-1]
                policy, _, role = env.producer.rpartition(".")
                hb = env.heartbeat
                if (env.WhichOneof("payload") != "heartbeat" or env.producer != producer
                    or role != hb.role or role not in ROLES):
                    self.counts["rejected"] += 1
                    continue
                if not hb.stage_seconds:
                    self.counts["no_stages"] += 1
                    continue
                try:
                    self.controller.report_step(exp.id, policy, role, int(hb.step), dict(hb.stage_seconds))
                except KeyError:
                    self.counts["unknown_policy"] += 1
                    continue
                fed += 1
                self.counts["fed"] += 1
            sub.ack(received)
        return fed
