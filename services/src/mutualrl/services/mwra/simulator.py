"""A discrete-event simulator that proves MWRA's plans before a cluster does. Pure Python + numpy.

N policies train S steps on G GPUs (nodes of 8). A policy may start step s only when every peer
has finished step s-1-L (L = bounded staleness), so the fleet moves at its slowest policy's pace.
A step's cost is the policy's W times a drift (responses lengthen as training goes on) times the
mean of log-normal response lengths; generation overlaps training, so a step takes the longer of
the two on its split (see ``planner.step_seconds``). Moving a policy to a new allocation stalls it
for ``move_cost_s`` (pod start, model load, weight sync). A node can fail mid-run.

Strategies compared: ``equal`` split, one-shot ``proportional`` to the seeded cost estimates,
``mwra`` (seeded plan, then measured costs with hysteresis), and ``best_static`` — the best fixed
integer plan in hindsight (brute force over every count vector for N <= 4, ranked by the lockstep
makespan, the five best simulated exactly).
"""

from __future__ import annotations

import heapq
import itertools
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

import numpy as np
from typing_extensions import override

from mutualrl.services.mwra.planner import (
    CALIBRATION_GAIN,
    CALIBRATION_STEPS,
    DWELL_STEPS,
    MAX_HORIZON_STEPS,
    Allocation,
    MeasuredCosts,
    Node,
    Plan,
    PlanningError,
    PolicyDemand,
    ReplanSchedule,
    best_split,
    decide_replan,
    lower_bound_step_seconds,
    make_plan,
    pack,
    planning_horizon,
    role_times,
)


@dataclass(frozen=True)
class SimPolicy:
    """A simulated policy: its true costs, drift, response-length spread and seeding error."""
    demand: PolicyDemand  # the true costs at step 0 and the gang shape
    drift: float = 0.0  # W grows linearly by this fraction over the run
    length_sigma: float = 1.0  # sigma of the log-normal response lengths
    samples_per_step: int = 256  # completions per step; their mean length scales the step
    estimate_error: float = 1.0  # the seeded estimate is the true W times this


@dataclass(frozen=True)
class Scenario:
    """A simulated fleet: policies, GPUs in nodes, steps, staleness, move cost and an optional node loss."""
    policies: tuple[SimPolicy, ...]
    gpus: int
    node_size: int = 8
    steps: int = 200
    staleness: int = 1
    move_cost_s: float = 120.0
    node_loss_step: int | None = None  # a node fails once the slowest policy finished this step
    seed: int = 0

    def nodes(self) -> list[Node]:
        """The scenario's nodes: full ones of ``node_size`` GPUs and the remainder."""
        full, rest = divmod(self.gpus, self.node_size)
        return [Node(f"node-{i}", self.node_size) for i in range(full)] + ([Node(f"node-{full}", rest)] if rest else [])

    def costs(self) -> np.ndarray:
        """cost[k, s-1]: one-GPU seconds of policy k's step s."""
        rng = np.random.default_rng(self.seed)
        out = np.empty((len(self.policies), self.steps))
        for k, p in enumerate(self.policies):
            sig = p.length_sigma
            lengths = rng.lognormal(-sig * sig / 2, sig, size=(self.steps, p.samples_per_step)).mean(axis=1)
            drift = 1.0 + p.drift * np.arange(self.steps) / max(1, self.steps - 1)
            out[k] = p.demand.step_gpu_seconds * drift * lengths
        return out


@dataclass
class SimResult:
    """One strategy's simulated run: makespan against the lower bound and the table's other columns."""
    strategy: str
    makespan_s: float | None
    lower_bound_s: float
    utilisation: float
    max_step_s: float
    min_step_s: float
    peer_lag_steps: int
    replans: int
    partial_gang_gpu_seconds: float
    longest_no_progress_s: float
    stalled: bool = False
    post_loss_over_new_lower_bound: float | None = None
    timeline: list[tuple[float, str, int]] = field(default_factory=list)  # (finish time, policy, step)
    gang_lower_bound_s: float | None = None  # the bound that knows each policy's minimum gang

    @property
    def makespan_over_lower_bound(self) -> float | None:
        """Makespan over the lower bound (None when the run stalled)."""
        return None if self.makespan_s is None else self.makespan_s / self.lower_bound_s

    @property
    def makespan_over_gang_bound(self) -> float | None:
        """Makespan over the gang-aware lower bound: what a plan that can exist is measured against."""
        if self.makespan_s is None or not self.gang_lower_bound_s:
            return None
        return self.makespan_s / self.gang_lower_bound_s

    def to_dict(self) -> dict:
        """The result as JSON."""
        return {
            "makespan_s": self.makespan_s, "lower_bound_s": self.lower_bound_s,
            "makespan_over_lower_bound": self.makespan_over_lower_bound,
            # the plain bound ignores that a policy's GPUs come in gangs; the gang-aware one is what a plan can reach
            "gang_lower_bound_s": self.gang_lower_bound_s, "makespan_over_gang_bound": self.makespan_over_gang_bound,
            "utilisation": self.utilisation, "max_step_s": self.max_step_s, "min_step_s": self.min_step_s,
            "peer_lag_steps": self.peer_lag_steps,
            "replans": self.replans, "partial_gang_gpu_seconds": self.partial_gang_gpu_seconds,
            "longest_no_progress_s": self.longest_no_progress_s,
            "stalled": self.stalled, "post_loss_over_new_lower_bound": self.post_loss_over_new_lower_bound,
        }


# ---- strategies -------------------------------------------------------------------------------

def plan_from_counts(demands: Sequence[PolicyDemand], counts: dict[str, int], nodes: Sequence[Node], generation: int,
                     reason: str) -> Plan:
    """Splits and placements for given counts; a policy below its minimum gang keeps its GPUs
    as a partial gang (it holds them and cannot make progress)."""
    splits, allocs = {}, {}
    for d in demands:
        g = counts[d.name]
        splits[d.name] = best_split(d, g)[:2] if g >= d.min_gang else (g, 0)
    whole = [d for d in demands if counts[d.name] >= d.min_gang]
    try:
        placed = pack(whole, {d.name: splits[d.name] for d in whole}, nodes)
    except PlanningError:
        placed = {}
    for d in demands:
        r, l = splits[d.name]
        step = max(role_times(d, r, l)) + d.sync_seconds if l > 0 else math.inf
        allocs[d.name] = Allocation(d.name, r, l, step, placed.get(d.name, ()))
    return Plan(allocs, sum(n.gpus for n in nodes), lower_bound_step_seconds(demands, sum(n.gpus for n in nodes)),
                generation, reason)


class Strategy(ABC):
    """How a fleet's GPUs are divided: a first plan, optional re-plans as steps are measured,
    and a plan after a node is lost."""

    name = "strategy"

    def __init__(self) -> None:
        self.replans = 0
        self.plan: Plan | None = None

    @abstractmethod
    def initial(self, estimates: Sequence[PolicyDemand], nodes: Sequence[Node]) -> Plan:
        """The plan the run starts with, from the seeded cost estimates."""

    def observe(self, demand: PolicyDemand, split: tuple[int, int], generate_s: float, train_s: float,
                remaining_steps: int) -> Plan | None:
        """A step finished on ``split`` (rollout, learner GPUs: the one it *ran* on, which for a
        step in flight during a move is the old one); return a new plan to move to it."""
        return None

    @abstractmethod
    def node_lost(self, nodes: Sequence[Node], remaining_steps: int) -> Plan:
        """The plan on the nodes that are left."""


class EqualSplit(Strategy):
    """Every policy gets the same number of GPUs."""
    name = "equal"

    @override
    def initial(self, estimates, nodes):
        self.demands = list(estimates)
        total = sum(n.gpus for n in nodes)
        self.plan = plan_from_counts(self.demands, {d.name: total // len(self.demands) for d in self.demands}, nodes, 0,
                                     "initial")
        return self.plan

    @override
    def node_lost(self, nodes, remaining_steps):
        self.replans += 1
        old = self.plan
        self.initial(self.demands, nodes)
        self.plan = replace(self.plan, generation=old.generation + 1, reason="node_lost")
        return self.plan


def proportional_counts(demands: Sequence[PolicyDemand], total: int) -> dict[str, int]:
    """GPUs proportional to W, each at least its minimum gang, rounded by largest remainder."""
    counts = {d.name: d.min_gang for d in demands}
    rest = total - sum(counts.values())
    if rest <= 0:
        return counts
    weights = np.array([d.step_gpu_seconds for d in demands])
    target = np.array([d.min_gang for d in demands]) + 0.0
    ideal = total * weights / weights.sum()
    extra = np.maximum(ideal - target, 0.0)
    extra = extra / extra.sum() * rest if extra.sum() > 0 else np.full(len(demands), rest / len(demands))
    floors = np.floor(extra).astype(int)
    order = np.argsort(-(extra - floors))
    for i in order[: rest - floors.sum()]:
        floors[i] += 1
    for d, f in zip(demands, floors):
        counts[d.name] += int(f)
    return counts


class Proportional(EqualSplit):
    """GPUs proportional to the seeded costs, decided once."""
    name = "proportional"

    @override
    def initial(self, estimates, nodes):
        self.demands = list(estimates)
        self.plan = plan_from_counts(self.demands, proportional_counts(self.demands, sum(n.gpus for n in nodes)), nodes,
                                     0, "initial")
        return self.plan


class Mwra(Strategy):
    """The controller's logic: seeded plan, measured costs (exponential average), re-plan with
    hysteresis, immediate re-plan on a lost node."""

    name = "mwra"

    def __init__(self, move_cost_s: float, min_gain: float = 0.10, alpha: float = 0.2,
                 calibration_gain: float = CALIBRATION_GAIN,
                 max_horizon: float = MAX_HORIZON_STEPS):
        super().__init__()
        self.move_cost_s, self.max_horizon = move_cost_s, max_horizon
        self.schedule = ReplanSchedule(min_gain, calibration_gain)
        self.dwell_steps = DWELL_STEPS
        self.measured = MeasuredCosts(alpha=alpha)

    @override
    def initial(self, estimates, nodes):
        self.demands, self.nodes = list(estimates), list(nodes)
        self.schedule.dwell = self.dwell_steps * len(self.demands)
        self.plan = make_plan(self.demands, self.nodes)
        return self.plan

    @override
    def observe(self, demand, split, generate_s, train_s, remaining_steps):
        self.measured.observe(demand, *split, generate_s, train_s)
        if len(self.measured.values) < len(self.demands):
            return None  # re-plan only once every policy has been measured
        judgement = self.schedule.next(self.measured.has([d.name for d in self.demands], CALIBRATION_STEPS))
        if judgement is None:
            return None
        current = self.measured.apply(self.demands, planning_horizon(remaining_steps, self.max_horizon),
                                      judgement.window_fit)
        candidate = make_plan(current, self.nodes, self.plan.generation + 1, judgement.reason)
        decision = decide_replan(current, self.plan, candidate, remaining_steps, self.move_cost_s, judgement.min_gain)
        self.schedule.judged(judgement, decision.gain)
        if not decision.replan:
            return None
        self.replans += 1
        self.schedule.moved()
        self.plan = candidate
        return candidate

    @override
    def node_lost(self, nodes, remaining_steps):
        self.nodes = list(nodes)
        self.replans += 1
        self.schedule.moved()
        self.plan = make_plan(self.measured.apply(self.demands, planning_horizon(remaining_steps, self.max_horizon)),
                              self.nodes, self.plan.generation + 1, "node_lost")
        return self.plan


class FixedPlan(Strategy):
    """A given static plan (used by the best-static search); on a lost node it takes the next."""

    name = "best_static"

    def __init__(self, counts: dict[str, int], after_loss: dict[str, int] | None = None):
        super().__init__()
        self.counts, self.after_loss = counts, after_loss

    @override
    def initial(self, estimates, nodes):
        self.demands = list(estimates)
        self.plan = plan_from_counts(self.demands, self.counts, nodes, 0, "initial")
        return self.plan

    @override
    def node_lost(self, nodes, remaining_steps):
        self.replans += 1
        counts = self.after_loss or proportional_counts(self.demands, sum(n.gpus for n in nodes))
        self.plan = plan_from_counts(self.demands, counts, nodes, self.plan.generation + 1, "node_lost")
        return self.plan


# ---- the event loop ---------------------------------------------------------------------------

def run(scenario: Scenario, strategy: Strategy, costs: np.ndarray | None = None) -> SimResult:
    """Simulate one strategy on a scenario, step by step, with its re-plans, moves and node loss."""
    sc = scenario
    costs = sc.costs() if costs is None else costs
    truth = [p.demand for p in sc.policies]
    estimates = [replace(p.demand, step_gpu_seconds=p.demand.step_gpu_seconds * p.estimate_error) for p in sc.policies]
    n, S, L = len(truth), sc.steps, sc.staleness
    nodes = sc.nodes()
    plan = strategy.initial(estimates, nodes)
    lb = _lower_bound(truth, costs, sc.gpus)
    finish = np.full((n, S + 1), np.nan)
    finish[:, 0] = 0.0
    done = [0] * n
    ready_at = [0.0] * n  # a moved policy's GPUs are ready at this time
    move_pending = [False] * n
    partial, busy, lag = 0.0, 0.0, 0
    completions: list[tuple[float, int, int, float, float, tuple[int, int]]] = []
    timeline: list[tuple[float, str, int]] = []
    loss_time: float | None = None
    loss_progress = 0
    step_times: list[float] = []
    capacity_before = float(sc.gpus)

    def alloc(k: int) -> Allocation:
        return plan.allocations[truth[k].name]

    if (stalled := _stalled(strategy, plan, truth, lb)) is not None:
        return stalled
    failed_node, node_failed = nodes[0].name, False

    def apply(new_plan: Plan, at: float) -> None:
        nonlocal plan
        for k in range(n):
            old, new = alloc(k), new_plan.allocations[truth[k].name]
            lost = node_failed and any(pl.node == failed_node for pl in old.placements)
            if (old.rollout_gpus, old.learner_gpus) != (new.rollout_gpus, new.learner_gpus) or lost:
                move_pending[k] = True
                ready_at[k] = max(ready_at[k], at)
        plan = new_plan

    while min(done) < S:
        start, k = _next_step(done, finish, ready_at, S, L)
        # the controller sees every step that finished before this one starts, in order
        while completions and completions[0][0] <= start:
            t, j, s_j, gen_s, train_s, split = heapq.heappop(completions)
            timeline.append((t, truth[j].name, s_j))
            if sc.node_loss_step is not None and loss_time is None and min(done) >= sc.node_loss_step:
                loss_time, loss_progress = t, max(done)
                capacity_before = sc.gpus
                nodes, node_failed = nodes[1:], True  # node-0 fails: its gangs restart elsewhere
                apply(strategy.node_lost(nodes, S - min(done)), t)
                continue
            new = strategy.observe(truth[j], split, gen_s, train_s, S - min(done))
            if new is not None:
                apply(new, t)
        start = max(start, ready_at[k])
        s = done[k] + 1
        a = alloc(k)
        gen_s, train_s = role_times(truth[k], a.rollout_gpus, a.learner_gpus,
                                    costs[k, s - 1] / truth[k].step_gpu_seconds)
        duration = max(gen_s, train_s) + truth[k].sync_seconds
        step_times.append(duration)
        if move_pending[k]:
            duration += sc.move_cost_s
            move_pending[k] = False
        finish[k, s] = start + duration
        busy += a.rollout_gpus * gen_s + a.learner_gpus * train_s
        done[k] = s
        lag = max(lag, max(done) - min(done))
        heapq.heappush(completions, (finish[k, s], k, s, gen_s, train_s, (a.rollout_gpus, a.learner_gpus)))
    timeline += [(t, truth[j].name, s_j) for t, j, s_j, *_ in sorted(completions)]
    makespan = float(finish[:, S].max())
    after_loss = 0.0 if loss_time is None else (capacity_before - sc.node_size) * (makespan - loss_time)
    capacity = sc.gpus * makespan if loss_time is None else capacity_before * loss_time + after_loss
    post = None if loss_time is None else _post_loss_ratio(truth, costs, finish, loss_progress, sc.gpus - sc.node_size)
    return SimResult(
        strategy.name, makespan, lb, busy / capacity, max(step_times), min(step_times), lag, strategy.replans, partial,
        _longest_gap(timeline, makespan), post_loss_over_new_lower_bound=post, timeline=timeline,
        gang_lower_bound_s=gang_lower_bound(truth, costs, sc.gpus),
    )


def _longest_gap(timeline: list[tuple[float, str, int]], makespan: float) -> float:
    """The longest wait between two consecutive step completions of any policy (the whole run when none)."""
    times = sorted(t for t, _, _ in timeline)
    return float((np.diff([0.0, *times]) if times else np.array([makespan])).max())


def _stalled(strategy: Strategy, plan: Plan, truth: Sequence[PolicyDemand], lb: float) -> SimResult | None:
    """A plan that leaves some policy without a learner GPU (a partial gang) can never progress:
    the run stalls, holding those GPUs for a horizon of ten lower bounds."""
    allocs = [plan.allocations[d.name] for d in truth]
    if not any(a.learner_gpus == 0 for a in allocs):
        return None
    horizon = lb * 10
    held = sum(a.gpus for a in allocs if a.learner_gpus == 0)
    return SimResult(strategy.name, None, lb, 0.0, math.inf, math.inf, 0, strategy.replans, held * horizon, horizon,
                     stalled=True)


def _next_step(done: list[int], finish: np.ndarray, ready_at: list[float], steps: int,
               staleness: int) -> tuple[float, int]:
    """The policy whose next step can start first, and when: after its previous step, after its
    GPUs are ready, and — under the staleness bound L — after every policy finished step s − 1 − L."""
    n = len(done)
    best: tuple[float, int] | None = None
    for k in range(n):
        s = done[k] + 1
        if s > steps:
            continue
        dep = s - 1 - staleness
        if dep >= 1 and any(done[j] < dep for j in range(n)):
            continue
        start = max(finish[k, s - 1], ready_at[k], max(finish[j, dep] for j in range(n)) if dep >= 1 else 0.0)
        if best is None or start < best[0]:
            best = (start, k)
    assert best is not None, "the staleness bound deadlocked the simulation"
    return best


def _lower_bound(truth: Sequence[PolicyDemand], costs: np.ndarray, gpus: int) -> float:
    """max(sum of all work / G, max_k (its work / min(G, M_k) + its syncs))."""
    spread = costs.sum() / gpus
    single = max(costs[k].sum() / min(gpus, d.max_gpus or gpus) + d.sync_seconds * costs.shape[1]
                 for k, d in enumerate(truth))
    return float(max(spread, single))


def _gpus_for_speed(x: float, eta: float) -> float:
    """The fewest GPUs (a real number) that reach speed ``x`` when ``g`` GPUs run at ``1 + eta * (g - 1)``."""
    if x <= 0:
        return 0.0
    return 1.0 + (x - 1.0) / eta if x > 1 else 1.0


def _gang_need(d: PolicyDemand, work: float, steps: int, makespan: float) -> int:
    """The fewest whole GPUs on which ``d`` does ``work`` GPU-seconds of ``steps`` steps within ``makespan`` with
    one split: each role fast enough for its share (generation and training overlap; the weight sync does not),
    the rollout in whole TP groups, each role at least its minimum, the total on the policy's grid."""
    busy = makespan - d.sync_seconds * steps
    if busy <= 0:
        return 10 ** 9
    f = d.generate_fraction
    r = _gpus_for_speed(f * work / busy, d.scaling_efficiency)
    rollout = max(d.min_rollout, d.rollout_tp * math.ceil(r / d.rollout_tp - 1e-9)) if f > 0 else d.min_rollout
    learner = max(d.learner_min_gpus, math.ceil(_gpus_for_speed((1 - f) * work / busy, d.scaling_efficiency) - 1e-9))
    g = d.min_gang + max(0, math.ceil((rollout + learner - d.min_gang) / d.granularity - 1e-9)) * d.granularity
    if d.max_gpus is not None and g > d.max_gpus:
        return 10 ** 9  # not within this makespan on any number of GPUs it can use
    return g


def gang_lower_bound(truth: Sequence[PolicyDemand], costs: np.ndarray, gpus: int) -> float:
    """The gang-aware bound: the smallest makespan M with sum_k need_k(M) <= G, need_k(M) = max(gang_k, W_k / M) in
    whole GPUs per role — the rollout's in TP groups — for policy k's work W_k (docs/mwra.md, "Bounds"). Under
    bounded staleness every policy runs until the end and holds its GPUs while it runs, so no plan that keeps one
    integer split per policy finishes sooner; the plain bound (work / G) ignores gangs and whole GPUs. A plan that
    changes its splits over time can hold, say, 2.5 GPUs on average and come in just under it."""
    if sum(d.min_gang for d in truth) > gpus:
        return math.inf
    work, steps = costs.sum(axis=1), costs.shape[1]

    def fits(m: float) -> bool:
        return sum(_gang_need(d, w, steps, m) for d, w in zip(truth, work)) <= gpus

    lo = _lower_bound(truth, costs, gpus)
    if fits(lo):
        return lo
    hi = lo * 2
    while not fits(hi):
        lo, hi = hi, hi * 2
    for _ in range(60):  # bisection on M: the GPUs needed fall as M grows
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def _post_loss_ratio(truth, costs, finish, progress: int, gpus: int) -> float | None:
    """Pace after the re-plan (from two steps after the loss to the end) over the lower bound
    on the smaller fleet for the same steps."""
    S = costs.shape[1]
    s0 = min(S - 1, progress + 2)
    if S - s0 < 5:
        return None
    elapsed = float(finish[:, S].max() - finish[:, s0].max())
    return elapsed / _lower_bound(truth, costs[:, s0:], gpus)


# ---- best static plan in hindsight ------------------------------------------------------------

def _count_grid(d: PolicyDemand, total: int) -> list[int]:
    top = min(total, d.max_gpus or total)
    return list(range(d.min_gang, top + 1, d.granularity))


def best_static_counts(truth: Sequence[PolicyDemand], costs: np.ndarray, total: int, staleness: int,
                       top: int = 5) -> list[dict[str, int]]:
    """Every integer count vector (the last policy takes what is left), ranked by the lockstep
    makespan sum_s max_k t_k(s), the ``top`` best returned for exact simulation."""
    grids = [_count_grid(d, total) for d in truth]
    if any(not g for g in grids):
        raise PlanningError("the minimum gangs do not fit")
    # t[k][g] = per-step seconds of policy k on g GPUs (its best split), vector over steps
    table = []
    for k, d in enumerate(truth):
        rows = {}
        for g in grids[k]:
            r, l, _ = best_split(d, g)
            scale = costs[k] / d.step_gpu_seconds
            gen, train = role_times(d, r, l)
            rows[g] = np.maximum(gen * scale, train * scale) + d.sync_seconds
        table.append(rows)
    scored: list[tuple[float, tuple[int, ...]]] = []
    last = truth[-1]
    head = [grids[k] for k in range(len(truth) - 1)]
    for combo in itertools.product(*head):
        rest = total - sum(combo)
        if rest < last.min_gang:
            continue
        g_last = min(rest, last.max_gpus or rest)
        g_last = last.min_gang + ((g_last - last.min_gang) // last.granularity) * last.granularity
        counts = (*combo, g_last)
        stacked = np.max([table[k][counts[k]] for k in range(len(truth))], axis=0)
        scored.append((float(stacked.sum()), counts))
    scored.sort()
    return [{truth[k].name: c[k] for k in range(len(truth))} for _, c in scored[:top]]


def best_static(scenario: Scenario, costs: np.ndarray) -> SimResult | None:
    """The best fixed split in hindsight, by brute force (None beyond 4 policies)."""
    truth = [p.demand for p in scenario.policies]
    if len(truth) > 4:
        return None
    after = None
    if scenario.node_loss_step is not None:
        s0 = scenario.node_loss_step
        after = best_static_counts(truth, costs[:, s0:], scenario.gpus - scenario.node_size, scenario.staleness,
                                   top=1)[0]
    results = [run(scenario, FixedPlan(c, after), costs) for c in best_static_counts(truth, costs, scenario.gpus,
        scenario.staleness)]
    return min(results, key=lambda r: r.makespan_s if r.makespan_s is not None else math.inf)


# ---- scenarios and comparison -----------------------------------------------------------------

def build_scenario(
    policies: int, gpus: int, cost_ratio: float, seed: int = 0, steps: int = 200, drift: float = 0.5,
    node_loss_step: int | None = None,
    estimate_sigma: float = 0.3, move_cost_s: float = 120.0, target_step_s: float = 60.0,
) -> Scenario:
    """Policies whose costs spread geometrically from 1 to ``cost_ratio``; generation shares,
    TP sizes, drifts and seeding errors drawn from ``seed``. Costs are scaled so that the
    lower-bound step is about ``target_step_s`` seconds."""
    if policies < 1 or gpus < 1 or cost_ratio < 1:
        raise PlanningError("need policies >= 1, gpus >= 1 and cost_ratio >= 1")
    rng = np.random.default_rng(seed + 7919)
    raw = [cost_ratio ** (i / max(1, policies - 1)) for i in range(policies)]
    scale = target_step_s * gpus / sum(raw)
    out = []
    for i, w in enumerate(raw):
        tp = 2 if (w * scale / gpus > 0.4 * target_step_s and gpus >= 16) else 1
        d = PolicyDemand(f"policy-{i}", w * scale, float(rng.uniform(0.4, 0.7)), rollout_tp=tp, granularity=1)
        out.append(SimPolicy(d, drift=float(rng.uniform(0, drift)), estimate_error=float(rng.lognormal(0,
            estimate_sigma))))
    return Scenario(tuple(out), gpus, steps=steps, node_loss_step=node_loss_step, move_cost_s=move_cost_s, seed=seed)


def compare(scenario: Scenario,
            names: Iterable[str] = ("equal", "proportional", "mwra", "best_static")) -> dict[str, SimResult | None]:
    """Each named strategy's simulation on the same scenario and costs."""
    costs = scenario.costs()
    out: dict[str, SimResult | None] = {}
    for name in names:
        if name == "equal":
            out[name] = run(scenario, EqualSplit(), costs)
        elif name == "proportional":
            out[name] = run(scenario, Proportional(), costs)
        elif name == "mwra":
            out[name] = run(scenario, Mwra(scenario.move_cost_s), costs)
        elif name == "best_static":
            out[name] = best_static(scenario, costs)
        else:
            raise PlanningError(f"unknown strategy {name!r}; known: equal, proportional, mwra, best_static")
    return out
