"""The peer half of a learner's gathering, as ``OwnIntake`` is the own half: its subscription to the peers' streams,
the messages that arrived early for a later step, SGT's success bank, the peers' reputations, and what one step's
peer messages become — an :class:`IntakeResult` checked by the zero-trust :class:`PeerIntake` (docs/algorithms.md
§3.2). Like the own side, nothing is acknowledged before the step's update used it: :meth:`settle` says what to
acknowledge and keeps the refused messages, which :meth:`commit` dead-letters."""

from __future__ import annotations

from typing import Callable

from mutualrl.see import ExperienceExchange, Received
from mutualrl.services.learner.peer_experience import IntakeResult, PeerIntake, PeerRefusal, dead_letter
from mutualrl.services.learner.reputation import PeerReputation, ReputationEvent
from mutualrl.services.learner.success_bank import SuccessBank
from mutualrl.tasks import Problem


class PeerGathering:
    """One learner's peer experience, step by step. ``not_consumed`` drops (and acknowledges) re-deliveries a
    durable checkpoint already covers (the learner's exactly-once ledger)."""

    def __init__(self, policy: str, exchange: ExperienceExchange, peers: list[str], kinds: list[str],
                 checker: PeerIntake, bank: SuccessBank | None,
                 not_consumed: Callable[[list[Received], object], list[Received]]):
        self.policy = policy
        self.sub = exchange.subscribe(policy, kinds, peers, consumer=f"{policy}-learner") if kinds and peers else None
        self.checker = checker
        self.bank = bank  # peers' successes for prompts not trained now, kept for when the prompt comes up
        self.buffer: list[Received] = []  # arrived for a later step
        self.reputation = PeerReputation()
        self.events: list[ReputationEvent] = []  # the last step's reputation changes (the service logs them)
        self._not_consumed = not_consumed
        self._to_refuse: list[PeerRefusal] = []  # dead-lettered at commit()

    def gather(self, step: int, problems: dict[str, Problem]) -> tuple[IntakeResult, int]:
        """This step's peer messages, checked per kind, with a quarantined peer's experience dropped; and how many
        successes came out of the bank."""
        intake = IntakeResult()
        by_kind: dict[str, list[Received]] = {}
        for m in self._collect(step):
            by_kind.setdefault(m.kind, []).append(m)
        released = self._successes(by_kind.get("verified_success", []), step, problems, intake)
        self.checker.rollouts(by_kind.get("rollout", []), step, problems, intake)
        self.checker.advantage_stats(by_kind.get("advantage_stats", []), step, problems, intake)
        self._apply_reputation(step, intake)
        return intake, released

    def settle(self, intake: IntakeResult) -> list[Received]:
        """After the step's update: what to acknowledge at the commit (refused messages are kept to be
        dead-lettered instead)."""
        refused = {id(r.message) for r in intake.refusals}
        self._to_refuse += intake.refusals
        return [m for m in intake.used if id(m) not in refused]

    def commit(self) -> None:
        """Dead-letter the refused messages of the steps since the last commit."""
        for refusal in self._to_refuse:
            dead_letter(self.sub, refusal, self.policy)
        self._to_refuse = []

    def _collect(self, step: int) -> list[Received]:
        if self.sub is None:
            return []
        got = self.buffer + self._not_consumed(self.sub.poll(), self.sub)
        self.buffer = [r for r in got if r.payload.step > step]
        return [r for r in got if r.payload.step <= step]

    def _successes(self, messages: list[Received], step: int, problems: dict[str, Problem],
                   intake: IntakeResult) -> int:
        """Peers' verified successes into the intake (SGT). With a bank, those for prompts not in this step are
        banked (acknowledged with the step) and banked ones for this step's prompts come out, checked against the
        bank's age bound instead of ``sharing.max_version_lag``; how many came out of the bank."""
        if self.bank is None:
            self.checker.verified_successes(messages, step, problems, intake)
            return 0
        later = [m for m in messages if m.payload.prompt_id not in problems]
        self.bank.deposit(later, step)
        intake.used += later
        self.checker.verified_successes([m for m in messages if m.payload.prompt_id in problems], step, problems,
                                        intake)
        released = self.bank.withdraw(set(problems), step)
        if released:
            self.checker.verified_successes(released, step, problems, intake, max_lag=self.bank.max_age)
            again = {id(m) for m in released}  # acknowledged when banked: not again
            intake.used = [m for m in intake.used if id(m) not in again]
        return len(released)

    def _apply_reputation(self, step: int, intake: IntakeResult) -> None:
        """Score this step's checked claims per peer, then drop everything of a quarantined peer (its messages were
        still checked — that is how it earns its way out — and are acknowledged as consumed, counted as
        ``quarantined``)."""
        self.events = self.reputation.record_step(step, dict(intake.claims), dict(intake.failures))
        sources = (set(intake.claims) | {r.source_policy for r in [*intake.rows, *intake.rescues]}
                   | {st.producer for v in intake.stats.values() for st in v})
        bad = {p for p in sources if self.reputation.quarantined(p)}
        if not bad:
            return
        dropped = sum(1 for r in [*intake.rows, *intake.rescues] if r.source_policy in bad)
        intake.rows = [r for r in intake.rows if r.source_policy not in bad]
        intake.rescues = [r for r in intake.rescues if r.source_policy not in bad]
        for pid in list(intake.stats):
            kept = [st for st in intake.stats[pid] if st.producer not in bad]
            dropped += len(intake.stats[pid]) - len(kept)
            if kept:
                intake.stats[pid] = kept
            else:
                del intake.stats[pid]
        for p in bad:
            intake.peer_rewards.pop(p, None)
        if dropped:
            intake.rejected["quarantined"] += dropped
