"""MWRA's Prometheus metrics (names fixed by the dashboards and alerts)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mutualrl.services.mwra.planner import Plan


class MwraMetrics:
    """The controller's Prometheus metrics (allocations, predicted steps, re-plans, admission, evictions)."""
    def __init__(self, registry: CollectorRegistry):
        self.allocated = Gauge("mutualrl_mwra_allocated_gpus", "GPUs the current plan gives a policy's role.",
                               ["policy", "role"], registry=registry)
        self.predicted = Gauge("mutualrl_mwra_predicted_step_seconds",
                               "Predicted step seconds of a policy under the current plan.", ["policy"],
                               registry=registry)
        self.lb_ratio = Gauge("mutualrl_mwra_plan_lower_bound_ratio",
                              "Predicted fleet step over the lower bound (1 is perfect).", registry=registry)
        self.generation = Gauge("mutualrl_mwra_plan_generation", "Generation of the plan in force.", registry=registry)
        self.replans = Counter("mutualrl_mwra_replans", "Re-plans, by reason.", ["reason"], registry=registry)
        self.admission_wait = Histogram("mutualrl_mwra_gang_admission_wait_seconds",
                                        "Seconds from creating a gang to all its pods running.",
                                        registry=registry, buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 3600))
        self.evictions = Counter("mutualrl_mwra_gang_evictions",
                                 "Gangs evicted and requeued (admission timeout, lost node).", registry=registry)
        self.partial = Counter("mutualrl_mwra_partial_gang_gpu_seconds",
                               "GPU-seconds held by gangs missing a member (must stay 0).", registry=registry)
        for reason in ("initial", "measured", "cost_drift", "node_lost"):
            self.replans.labels(reason)
        self.partial.inc(0)

    def show(self, plan: Plan) -> None:
        """A plan's allocations and predictions into the Prometheus gauges."""
        for name, a in plan.allocations.items():
            self.allocated.labels(name, "rollout").set(a.rollout_gpus)
            self.allocated.labels(name, "learner").set(a.learner_gpus)
            self.predicted.labels(name).set(a.predicted_step_seconds)
        self.lb_ratio.set(plan.lower_bound_ratio)
        self.generation.set(plan.generation)
