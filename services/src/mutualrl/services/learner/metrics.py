"""The learner service's Prometheus metrics: what dashboards and alerts read of one policy's learner
(deploy/dashboards, deploy/alerts). Every labelled series a dashboard plots is exported from the
start at 0, so a panel shows a flat line rather than "no data" before the first event."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from mutualrl.runtime.stage_metrics import StageMetrics
from mutualrl.see import ExperienceExchange, SeeCollector
from mutualrl.services.learner.hinted_rescue import EDGE_COUNTS, HINT_REFUSALS
from mutualrl.services.learner.learner import Learner
from mutualrl.services.learner.step_record import StepRecord, cross_rows_split

PEER_REJECTION_REASONS = (
    "stale", "late", "unknown_prompt", "prompt_mismatch", "text_mismatch", "reverify_failed", "quarantined",
    "malformed", "empty",
    "unknown_tokenizer", "invalid_stats", "duplicate_stats", "thl_unaligned", "thl_roundtrip",
)
OWN_REJECTION_REASONS = ("unknown_prompt", "malformed", "too_long", "bad_token", "bad_group", "too_stale", "late",
                         "conflict", "unknown_version")
OWN_EVENTS = ("duplicate", "rescored")
"""Own rollouts used but worth counting: a repeat acknowledged (``duplicate``), a claimed reward corrected."""
EDGE_EVENTS = ("offered", "used", "stale", "thl_rejected", "rescues")
"""What a learner counts per incoming sharing edge (``mutualrl_edge_messages``)."""
CROSS_ROW_PLACES = ("not_below", "below_bound")
"""Where HACPO's cross rows sat against its ratio's lower clip bound (``mutualrl_hacpo_cross_rows``)."""


class LearnerMetrics:
    """One learner's series in its own registry (served by the service's ops endpoint)."""

    def __init__(self, policy: str, peers: list[str], exchange: ExperienceExchange, rescue: bool = False):
        self.policy = policy
        self.registry = r = CollectorRegistry()
        self.step = Gauge("mutualrl_step", "Last step this service finished.", ["policy", "role"], registry=r)
        self.version = Gauge("mutualrl_weights_version", "Weights version published.", ["policy", "role"], registry=r)
        self.thl_unaligned = Gauge("mutualrl_thl_unaligned_ratio",
                                   "Mean unaligned-byte fraction of the last step's peer messages, by source policy.",
                                   ["policy", "source"], registry=r)
        self.thl_logprob = Gauge("mutualrl_thl_logprob_residual_nats",
                                 "Mean |transported - source| sequence log-prob of the last step's peer messages.",
                                 ["policy", "source"], registry=r)
        self.thl_length = Gauge("mutualrl_thl_length_ratio",
                                "Mean target/source token-length ratio of the last step's peer messages.",
                                ["policy", "source"], registry=r)
        self.accuracy = Gauge("mutualrl_eval_accuracy_ratio", "Held-out greedy accuracy at the last evaluation.",
                              ["policy"], registry=r)
        self.weights_bytes = Gauge("mutualrl_weights_bytes", "Bytes of the last published weights version.", ["policy"],
                                   registry=r)
        self.sync = Gauge("mutualrl_weights_sync_seconds", "Seconds the last weights version took to publish "
                          "(learner) or to load into the engine (rollout).", ["policy", "role"], registry=r)
        self.stale = Gauge("mutualrl_staleness_steps", "Steps the slowest peer is behind this learner.",
                           ["policy", "role"], registry=r)
        self.reward = Gauge("mutualrl_reward_mean", "Mean own reward of the last step.", ["policy"], registry=r)
        self.no_signal = Gauge("mutualrl_no_signal_steps", "Consecutive steps in which every own group's rewards were "
                               "equal (GRPO had no signal of its own).", ["policy"], registry=r)
        self.quarantined = Gauge("mutualrl_peer_quarantined",
                                 "1 while this receiver ignores the peer's experience (its claims kept failing).",
                                 ["policy", "peer"], registry=r)
        self.stage_peak = Gauge("mutualrl_learner_stage_peak_resident_bytes",
                                "The learner process's peak resident memory in each stage of its last step "
                                "(intake, train, weight_sync): where its memory goes.", ["policy", "stage"], registry=r)
        self.rollouts = Counter("mutualrl_rollouts_consumed", "Own rollouts trained on.", ["policy"], registry=r)
        self.shared_in = Counter("mutualrl_shared_in", "Peer messages used (rows, rescues, stats).", ["policy"],
                                 registry=r)
        self.rejected = Counter("mutualrl_peer_rejected", "Peer messages rejected, by reason.", ["policy", "reason"],
                                registry=r)
        self.skipped = Counter("mutualrl_steps_skipped", "Steps with no own rollouts before the deadline.", ["policy"],
                               registry=r)
        self.roundtrip = Counter("mutualrl_thl_roundtrip_failures",
                                 "Peer messages whose text did not survive this tokenizer's round trip, by source.",
                                 ["policy", "source"], registry=r)
        self.thl_messages = Counter("mutualrl_thl_messages", "Peer messages converted by THL, by source.",
                                    ["policy", "source"], registry=r)
        self.rescues = Counter("mutualrl_rescues", "Verified peer successes trained on (SGT rescues).", ["policy"],
                               registry=r)
        self.empty_updates = Counter("mutualrl_empty_updates",
                                     "Mini-batches with no gradient signal, on which no optimiser step was taken.",
                                     ["policy"], registry=r)
        self.rescored = Counter("mutualrl_peer_rescored",
                                "Peer rows whose claimed reward the receiver's verifier corrected (used with its "
                                "score).",
                                ["policy"], registry=r)
        self.own_rejected = Counter("mutualrl_own_rejected",
                                    "Own rollouts refused and dead-lettered (unknown prompt, malformed, too long, bad "
                                    "token, bad group, too stale, late, conflict).",
                                    ["policy", "reason"], registry=r)
        self.own_events = Counter("mutualrl_own_events", "Own rollouts repeated (acknowledged, not used twice) or "
                                  "re-scored by the learner's verifier.", ["policy", "event"], registry=r)
        self.edges = Counter("mutualrl_edge_messages",
                             "Peer experience per sharing edge (source -> this receiver): offered, used (rows and "
                             "stats), refused as stale, refused by THL, and rescues.",
                             ["policy", "source", "event"], registry=r)
        self.hint_refused = Counter("mutualrl_hint_refused", "SGT-R hints refused (the prompt got plain samples), "
                                    "or rescue rounds that got no samples, by reason.", ["policy", "reason"],
                                    registry=r)
        self.quarantines = Counter("mutualrl_peer_quarantine_events",
                                   "Peers entering or leaving quarantine at this receiver.",
                                   ["policy", "peer", "action"], registry=r)
        self.cross_rows = Counter("mutualrl_hacpo_cross_rows", "HACPO's cross rows (peers' rows in its loss), by where "
                                  "their sequence ratio sat: below the lower clip bound (no gradient: the hard clamp, "
                                  "docs/algorithms.md §2.7) or not (at most these trained).", ["policy", "where"],
                                  registry=r)
        self._start_at_zero(peers, rescue)
        r.register(SeeCollector(exchange))
        self.stages = StageMetrics(r, policy, "learner")
        self._own_reported: dict[str, int] = {}  # own rejections already exported, by reason

    def _start_at_zero(self, peers: list[str], rescue: bool) -> None:
        """Every labelled series exported from the start, at 0: a dashboard shows "none yet", not "no data"."""
        policy = self.policy
        for reason in PEER_REJECTION_REASONS:  # every reason exported from the start, at 0
            self.rejected.labels(policy, reason)
        for reason in OWN_REJECTION_REASONS:
            self.own_rejected.labels(policy, reason)
        for event in OWN_EVENTS:
            self.own_events.labels(policy, event)
        self.rescored.labels(policy)
        self.rescues.labels(policy)
        for q in peers:
            self.quarantined.labels(policy, q).set(0)
            for event in EDGE_EVENTS + (EDGE_COUNTS if rescue else ()):  # SGT-R's hints and rescue samples
                self.edges.labels(policy, q, event)
        for reason in HINT_REFUSALS:  # from 0 in every mode: the dashboard's panel shows "none", not "no data"
            self.hint_refused.labels(policy, reason)
        for where in CROSS_ROW_PLACES:
            self.cross_rows.labels(policy, where)

    def position(self, step: int, version: int, lag: int | None = None) -> None:
        """Where the learner is: its last step, weights version and how far the slowest peer lags."""
        self.step.labels(self.policy, "learner").set(step)
        self.version.labels(self.policy, "learner").set(version)
        if lag is not None:
            self.stale.labels(self.policy, "learner").set(max(0, lag))

    def _observe_thl(self, rec: StepRecord) -> None:
        """Each incoming edge's THL figures of the step."""
        p = self.policy
        for src, h in rec.thl_by_source.items():
            self.thl_unaligned.labels(p, src).set(h["unaligned_mean"])
            self.thl_logprob.labels(p, src).set(h["logprob_residual_mean"])
            self.thl_length.labels(p, src).set(h["length_ratio_mean"])
            self.roundtrip.labels(p, src).inc(h["roundtrip_failures"])
            self.thl_messages.labels(p, src).inc(h["messages"])

    def _observe_cross_rows(self, rec: StepRecord) -> None:
        """HACPO's cross rows of the step, split by the share its mini-batches found below the ratio's lower bound."""
        split = cross_rows_split(rec.extra)
        if split is None:
            return
        self.cross_rows.labels(self.policy, "below_bound").inc(round(split[0]))
        self.cross_rows.labels(self.policy, "not_below").inc(round(split[1]))

    def observe(self, rec: StepRecord, learner: Learner) -> None:
        """One trained step's record (skipped steps count only as skipped)."""
        p = self.policy
        if rec.skipped:
            self.skipped.labels(p).inc()
            return
        self._observe_thl(rec)
        self.rescues.labels(p).inc(rec.rescue_count)
        self.empty_updates.labels(p).inc(rec.empty_updates)
        self.weights_bytes.labels(p).set(rec.weights_bytes)
        self.sync.labels(p, "learner").set(rec.stage_seconds.get("weight_sync") or 0.0)
        for stage, gib in (rec.extra.get("stage_peak_rss_gib") or {}).items():
            self.stage_peak.labels(p, stage).set(gib * 2**30)
        if rec.eval_accuracy is not None:
            self.accuracy.labels(p).set(rec.eval_accuracy)
        self.reward.labels(p).set(rec.reward_mean)
        self.no_signal.labels(p).set(rec.no_signal_steps)
        self.rollouts.labels(p).inc(len(learner.last_used.get("own", [])))
        self.shared_in.labels(p).inc(rec.shared_in)
        for reason, n in rec.peer_rejected.items():
            self.rejected.labels(p, reason).inc(n)
        for reason, n in (rec.extra.get("hint_refused") or {}).items():
            self.hint_refused.labels(p, reason).inc(n)
        self.rescored.labels(p).inc(rec.peer_rescored)
        self._observe_cross_rows(rec)
        for key, n in list(learner.totals.items()):
            if key.startswith("own_rejected:") or key in ("own_duplicate", "own_rescored"):
                done = self._own_reported.get(key, 0)
                if key.startswith("own_rejected:"):
                    self.own_rejected.labels(p, key.split(":", 1)[1]).inc(n - done)
                else:
                    self.own_events.labels(p, key.removeprefix("own_")).inc(n - done)
                self._own_reported[key] = n
        for edge, counts in learner.last_edges.items():
            source = edge.split("->", 1)[0]
            for event, n in counts.items():
                self.edges.labels(p, source, event).inc(n)
        for ev in rec.reputation_events:
            self.quarantines.labels(p, ev["peer"], ev["action"]).inc()
            self.quarantined.labels(p, ev["peer"]).set(1 if ev["action"] == "quarantined" else 0)
