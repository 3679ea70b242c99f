"""Peer reputation: a peer whose claims keep failing the receiver's checks is quarantined.

Every piece of peer experience carries claims the receiver can check — a success it re-verifies,
a reward it re-scores, text that must survive THL within budget. One wrong claim is noise (a
verifier edge case, a tokenizer quirk); a peer whose claims fail step after step is broken or
lying, and its experience should stop reaching the loss. Per peer we keep the claims and failures
of the last ``window`` steps; past ``threshold`` (with at least ``min_claims`` claims) the peer is
quarantined for this receiver. Its messages are still checked — that is how it earns its way out —
but nothing of it is used; after ``probation`` consecutive steps without a failed claim it is
released. Pure bookkeeping, no I/O: the learner logs and exports what it returns.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class ReputationEvent:
    """A peer entered or left quarantine at a step, with the failure rate that decided it."""

    step: int
    peer: str
    action: str  # "quarantined" | "released"
    failure_rate: float


@dataclass
class _PeerRecord:
    history: deque = field(default_factory=deque)  # (claims, failures) per recent step
    quarantined: bool = False
    clean_steps: int = 0


class PeerReputation:
    """Rolling failure rate of each peer's checked claims, and who is quarantined."""

    def __init__(self, window: int = 3, threshold: float = 0.5, min_claims: int = 4, probation: int = 5):
        if window < 1 or probation < 1 or not 0 < threshold <= 1:
            raise ValueError("need window >= 1, probation >= 1 and 0 < threshold <= 1")
        self.window, self.threshold, self.min_claims, self.probation = window, threshold, min_claims, probation
        self._peers: dict[str, _PeerRecord] = {}

    def quarantined(self, peer: str) -> bool:
        """Whether ``peer`` is quarantined now."""
        rec = self._peers.get(peer)
        return rec is not None and rec.quarantined

    def failure_rate(self, peer: str) -> float:
        """The share of ``peer``'s checked claims in the window that failed."""
        rec = self._peers.get(peer)
        if rec is None:
            return 0.0
        claims = sum(c for c, _ in rec.history)
        return sum(f for _, f in rec.history) / claims if claims else 0.0

    def record_step(self, step: int, claims: dict[str, int], failures: dict[str, int]) -> list[ReputationEvent]:
        """One step's checked claims and failures per peer; returns who entered or left quarantine."""
        events: list[ReputationEvent] = []
        for peer in set(claims) | set(failures):
            rec = self._peers.setdefault(peer, _PeerRecord(deque(maxlen=self.window)))
            c, f = int(claims.get(peer, 0)), int(failures.get(peer, 0))
            rec.history.append((c, f))
            rate = self.failure_rate(peer)
            if rec.quarantined:
                rec.clean_steps = rec.clean_steps + 1 if (c > 0 and f == 0) else 0
                if rec.clean_steps >= self.probation:
                    rec.quarantined, rec.clean_steps = False, 0
                    rec.history.clear()
                    events.append(ReputationEvent(step, peer, "released", rate))
            elif sum(x for x, _ in rec.history) >= self.min_claims and rate > self.threshold:
                rec.quarantined, rec.clean_steps = True, 0
                events.append(ReputationEvent(step, peer, "quarantined", rate))
        return events

    def state_dict(self) -> dict:
        """Each peer's window and status, for a checkpoint."""
        return {p: {"history": list(r.history), "quarantined": r.quarantined,
                    "clean_steps": r.clean_steps} for p, r in self._peers.items()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved."""
        self._peers = {p: _PeerRecord(deque((tuple(x) for x in v["history"]), maxlen=self.window),
                                      bool(v["quarantined"]), int(v["clean_steps"]))
                       for p, v in state.items()}
