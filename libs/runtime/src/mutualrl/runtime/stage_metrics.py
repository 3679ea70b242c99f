"""Per-stage step times and tokens as Prometheus metrics: what MWRA's planner reads (with the
same numbers on each service's heartbeat) to replace seeded step costs by measured ones."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

STAGES = ("generate", "logprob", "train", "weight_sync")
_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class StageMetrics:
    """``mutualrl_stage_seconds{policy,role,stage}`` (histogram) and
    ``mutualrl_stage_tokens_total{policy,role}``."""

    def __init__(self, registry: CollectorRegistry, policy: str, role: str):
        self.policy, self.role = policy, role
        self.seconds = Histogram("mutualrl_stage_seconds",
                                 "Seconds one step spent in a stage (generate, logprob, train, weight_sync).",
                                 ["policy", "role", "stage"], registry=registry, buckets=_BUCKETS)
        self.tokens = Counter("mutualrl_stage_tokens", "Tokens generated (rollout) or trained on (learner).",
                              ["policy", "role"], registry=registry)

    def observe(self, stage_seconds: dict[str, float], tokens: int) -> None:
        """One step's seconds per stage and its tokens into the Prometheus series."""
        for stage, seconds in stage_seconds.items():
            if stage in STAGES:
                self.seconds.labels(self.policy, self.role, stage).observe(seconds)
        self.tokens.labels(self.policy, self.role).inc(max(0, int(tokens)))
