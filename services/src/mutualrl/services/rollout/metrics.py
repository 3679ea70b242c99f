"""The rollout service's own Prometheus series (its gRPC server adds the serving ones): what the
dashboards read of one policy's sampling (deploy/dashboards)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from mutualrl.runtime.stage_metrics import StageMetrics
from mutualrl.see import ExperienceExchange, SeeCollector


class RolloutMetrics:
    """One rollout service's series, in the registry its ops endpoint serves."""

    def __init__(self, policy: str, registry: CollectorRegistry, exchange: ExperienceExchange):
        self.policy = policy
        self.step = Gauge("mutualrl_step", "Last step this service finished.", ["policy", "role"], registry=registry)
        self.rollouts = Counter("mutualrl_rollouts", "Rollouts published.", ["policy"], registry=registry)
        self.shared_out = Counter("mutualrl_shared_out", "Verified successes published for peers.", ["policy"],
                                  registry=registry)
        self.lag = Gauge("mutualrl_staleness_steps", "Steps between the learner's last step and the weights served.",
                         ["policy", "role"],
                         registry=registry)
        registry.register(SeeCollector(exchange))
        self.stages = StageMetrics(registry, policy, "rollout")
        self.refused = Counter("mutualrl_weights_refused",
                               "Announced weights versions this engine refused (checksum, shape, version order).",
                               ["policy"], registry=registry)

    def observe(self, step: int, published: int, successes: int, stages: dict[str, float], tokens: int,
                served_version: int) -> None:
        """One sampled step."""
        p = self.policy
        self.rollouts.labels(p).inc(published)
        self.shared_out.labels(p).inc(successes)
        self.stages.observe(stages, tokens)
        self.step.labels(p, "rollout").set(step)
        self.lag.labels(p, "rollout").set(max(0, step - 1 - served_version))
