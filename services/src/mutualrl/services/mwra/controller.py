"""The MWRA controller: experiments in, plans out, through one backend.

Every experiment is planned on the GPUs the backend reports minus what other experiments hold;
its gangs are applied whole. Measured step stages (reported by the services) replace the seeded
costs; a re-plan happens only when it pays (``planner.decide_replan``), at once when a node is
lost. Only the controller holding the Lease acts; the others answer reads and wait.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from mutualrl.config import ExperimentConfig
from mutualrl.see.identity import derive_key
from mutualrl.services.mwra.backends.base import Backend, BackendEvent, RunSpec
from mutualrl.services.mwra.demands import demands_from_config
from mutualrl.services.mwra.metrics import MwraMetrics
from mutualrl.services.mwra.planner import (
    CALIBRATION_GAIN,
    CALIBRATION_STEPS,
    DWELL_STEPS,
    Judgement,
    MeasuredCosts,
    Node,
    Plan,
    PlanningError,
    PolicyDemand,
    ReplanSchedule,
    decide_replan,
    make_plan,
    planning_horizon,
)


def run_see_keys(cfg: ExperimentConfig) -> dict[str, str]:
    """Every service's signing key for a run the controller starts, derived from the run key
    (``broker.hmac_key_env``, in the controller's environment): each pod then gets only its own
    and its sources'. Empty when the controller does not hold the key (pods derive their own)."""
    run_key = os.environ.get(cfg.broker.hmac_key_env) if cfg.broker.hmac_key_env else None
    if not run_key:
        return {}
    return {f"{p.name}.{r}": derive_key(run_key, f"{p.name}.{r}").decode() for p in cfg.policies for r in ("rollout",
        "learner")}


@dataclass
class Experiment:
    """A submitted experiment: its config, plan, measured costs, progress and plan history."""
    id: str
    config: ExperimentConfig
    yaml: str
    spec: RunSpec
    demands: list[PolicyDemand]
    plan: Plan
    status: str = "running"  # running | stopped
    created: float = field(default_factory=time.time)
    measured: MeasuredCosts = field(default_factory=MeasuredCosts)
    steps: dict[str, int] = field(default_factory=dict)  # policy -> newest reported step
    pending: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)  # (policy, step) -> stage seconds
    moved_at: dict[str, int] = field(default_factory=dict)  # policy -> its newest step when its split last changed
    stale_reports: int = 0  # measurements dropped because the step ran on a split since replaced
    history: list[dict] = field(default_factory=list)  # plan generations with their reasons
    schedule: ReplanSchedule = field(default_factory=ReplanSchedule)  # calibrations first, then the hysteresis

    @property
    def remaining_steps(self) -> int:
        """Steps left to the slowest policy."""
        return max(0, self.config.budget.steps - min(self.steps.get(p.name, 0) for p in self.config.policies))


class Controller:
    """Plans experiments onto the backend's GPUs and re-plans from measured step costs or lost nodes."""
    def __init__(self, backend: Backend, registry: CollectorRegistry | None = None, leader=None,
                 calibration_gain: float = CALIBRATION_GAIN):
        self.backend = backend
        self.registry = registry or CollectorRegistry()
        self.metrics = MwraMetrics(self.registry)
        self.leader = leader
        # the hysteresis, move cost and EMA are each experiment's `mwra` settings
        self.calibration_gain = calibration_gain
        self.experiments: dict[str, Experiment] = {}
        self.lock = threading.RLock()
        self.leading = leader is None

    # ---- planning ------------------------------------------------------------------------------
    def _free_nodes(self, excluding: str | None = None) -> list[Node]:
        held: dict[str, int] = {}
        for e in self.experiments.values():
            if e.id == excluding or e.status != "running":
                continue
            for a in e.plan.allocations.values():
                for p in a.placements:
                    held[p.node] = held.get(p.node, 0) + p.gpus
        nodes = [Node(n.name, n.gpus - held.get(n.name, 0)) for n in self.backend.nodes()]
        return [n for n in nodes if n.gpus > 0]

    def dry_run(self, cfg: ExperimentConfig) -> Plan:
        """The plan a config would get on the free GPUs now, placing nothing."""
        nodes = self._free_nodes()
        if not nodes:
            raise PlanningError("no free GPUs in the cluster")
        return make_plan(demands_from_config(cfg), nodes)

    def submit(self, cfg: ExperimentConfig, yaml_text: str, exp_id: str | None = None) -> Experiment:
        """Plan and start an experiment. A fixed ``exp_id`` (the chart's, at every controller
        start) re-applies the same objects instead of starting a second run."""
        with self.lock:
            if exp_id is not None and exp_id in self.experiments:
                return self.experiments[exp_id]
            plan = self.dry_run(cfg)
            exp_id = exp_id or f"{cfg.name.lower().replace('_', '-').replace('.', '-')[:40]}-{uuid.uuid4().hex[:6]}"
            spec = RunSpec.from_config(exp_id, yaml_text, cfg, run_see_keys(cfg))
            exp = Experiment(exp_id, cfg, yaml_text, spec, demands_from_config(cfg), plan,
                             measured=MeasuredCosts(alpha=cfg.mwra.ema_alpha),
                             schedule=ReplanSchedule(cfg.mwra.min_gain, self.calibration_gain,
                                                     dwell=DWELL_STEPS * len(cfg.policies)))
            self.backend.apply(spec, plan)
            self.experiments[exp_id] = exp
            self._record(exp, plan, "initial")
            return exp

    def _record(self, exp: Experiment, plan: Plan, reason: str) -> None:
        exp.plan = plan
        exp.history.append({"generation": plan.generation, "reason": reason, "at": time.time(),
                            "predicted_step_seconds": plan.predicted_step_seconds})
        self.metrics.replans.labels(reason).inc()
        self.metrics.show(plan)
        splits = ", ".join(f"{k} {a.rollout_gpus}+{a.learner_gpus}" for k, a in plan.allocations.items())
        self.backend.record_event(exp.spec, "Planned" if reason == "initial" else "Replanned",
                                  f"generation {plan.generation} ({reason}): {splits}")

    def replan(self, exp: Experiment, judgement: Judgement | None = None, forced: str | None = None) -> bool:
        # plan for the costs halfway through what is left, at most 25 steps ahead (as simulated)
        """Plan again from measured costs. Asked by the schedule (``judgement``), move only when the gain beats
        its bar and the cost of moving, and tell the schedule the predicted gain (a sustained gain lowers the next
        bar); ``forced`` (the reason, e.g. a lost node) moves whatever the gain."""
        reason = forced or judgement.reason
        window_fit = judgement.window_fit if judgement is not None else False
        demands = exp.measured.apply(exp.demands, planning_horizon(exp.remaining_steps), window_fit)
        try:
            candidate = make_plan(demands, self._free_nodes(excluding=exp.id), exp.plan.generation + 1, reason)
        except PlanningError:
            if forced is None:
                return False
            raise
        if forced is None:
            decision = decide_replan(demands, exp.plan, candidate, exp.remaining_steps, exp.config.mwra.move_cost_s,
                                     judgement.min_gain)
            exp.schedule.judged(judgement, decision.gain)
            if not decision.replan:
                return False
        for name, a in candidate.allocations.items():
            old = exp.plan.allocations.get(name)
            if old is None or (old.rollout_gpus, old.learner_gpus) != (a.rollout_gpus, a.learner_gpus):
                exp.moved_at[name] = exp.steps.get(name, 0)
        self.backend.apply(exp.spec, candidate)
        exp.schedule.moved()
        self._record(exp, candidate, reason)
        return True

    # ---- measurements --------------------------------------------------------------------------
    def report_step(self, exp_id: str, policy: str, role: str, step: int, stage_seconds: dict[str, float]) -> bool:
        """A service's stage times for one step; once both roles reported, it is a measurement.
        Returns whether the plan changed.

        A step that started before its policy's split changed ran on the *old* GPUs: dividing
        its seconds by the new split's speed would mis-measure W, so steps up to one past the
        newest step seen at the move (the one in flight) are dropped and counted."""
        with self.lock:
            exp = self.experiments[exp_id]
            if policy not in exp.plan.allocations:
                raise KeyError(policy)
            if policy in exp.moved_at and step <= exp.moved_at[policy] + 1:
                exp.steps[policy] = max(exp.steps.get(policy, 0), step)
                exp.stale_reports += 1
                exp.pending.pop((policy, step), None)
                return False
            part = exp.pending.setdefault((policy, step), {})
            part.update({f"{role}:{k}": float(v) for k, v in stage_seconds.items()})
            exp.steps[policy] = max(exp.steps.get(policy, 0), step)
            if not any(k.startswith("rollout:") for k in part) or not any(k.startswith("learner:") for k in part):
                return False
            exp.pending.pop((policy, step))
            gen = sum(v for k, v in part.items() if k.startswith("rollout:"))
            train = sum(v for k, v in part.items() if k.startswith("learner:") and not k.endswith(":weight_sync"))
            a = exp.plan.allocations[policy]
            demand = next(d for d in exp.demands if d.name == policy)
            exp.measured.observe(demand, a.rollout_gpus, a.learner_gpus, gen, train)
            if len(exp.measured.values) < len(exp.demands) or exp.status != "running":
                return False
            judgement = exp.schedule.next(exp.measured.has([d.name for d in exp.demands], CALIBRATION_STEPS))
            if judgement is None:
                return False
            return self.replan(exp, judgement)

    # ---- the loop ------------------------------------------------------------------------------
    def stop(self, exp_id: str) -> Experiment:
        """Stop an experiment: its objects are deleted and its GPUs freed."""
        with self.lock:
            exp = self.experiments[exp_id]
            if exp.status == "running":
                self.backend.delete(exp.spec.run)
                exp.status = "stopped"
            return exp

    def is_leader(self) -> bool:
        """Whether this controller leads (always, without leader election)."""
        self.leading = self.leader is None or self.leader.try_acquire()
        return self.leading

    def tick(self) -> list[BackendEvent]:
        """One reconcile: only the leader acts."""
        if not self.is_leader():
            return []
        with self.lock:
            events = self.backend.poll()
            for ev in events:
                if ev.kind == "gang_admitted":
                    self.metrics.admission_wait.observe(ev.seconds)
                elif ev.kind == "gang_evicted":
                    self.metrics.evictions.inc()
                elif ev.kind == "node_lost":
                    for exp in self.experiments.values():
                        nodes = {p.node for a in exp.plan.allocations.values() for p in a.placements}
                        if exp.status == "running" and ev.detail in nodes:
                            self.replan(exp, forced="node_lost")
            return events

    def view(self, exp: Experiment) -> dict:
        """An experiment as the API shows it."""
        return {"id": exp.id, "name": exp.config.name, "status": exp.status, "created": exp.created,
                "policies": [p.name for p in exp.config.policies],
                "plan_generation": exp.plan.generation, "remaining_steps": exp.remaining_steps,
                "stale_reports": exp.stale_reports, "steps": dict(exp.steps), "history": exp.history}

