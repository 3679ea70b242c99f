"""MWRA's planner: how many GPUs each policy and role gets. Pure functions, no I/O.

The fleet moves at the pace of its slowest policy (peers wait for each other within a bounded
staleness), so the plan minimises the largest predicted step time (docs/mwra.md, "Planning"):

- every policy first gets its minimum gang (rollout TP x replicas + learner GPUs) — all of it or
  the run is refused with one line naming the shortfall, never a partial start;
- the remaining GPUs are water-filled: the next unit (the policy's granularity) goes to the policy
  whose predicted step is slowest, until it cannot improve. For step times that fall as GPUs are
  added this greedy is optimal for the min-max objective (it never gives a policy more than the
  optimum needs while the maximum is still above the optimum);
- each policy's GPUs are split between rollout and learner so that generation and training, which
  overlap in the pipeline, take about as long as each other (by their measured shares);
- gangs are packed onto nodes first-fit-decreasing; a tensor-parallel group never spans nodes.

Speed on g GPUs is ``1 + eta*(g - 1)`` (eta, the scaling efficiency, is 1 for linear scaling) up
to the policy's maximum useful GPUs.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence


class PlanningError(ValueError):
    """A plan that cannot be made; the message is one line naming the shortfall."""


@dataclass(frozen=True)
class PolicyDemand:
    """What the planner knows about one policy.

    ``step_gpu_seconds`` is W, the cost of one training step on one GPU (generation and training
    together); ``generate_fraction`` is the share of W spent generating (the rollout role).
    """

    name: str
    step_gpu_seconds: float
    generate_fraction: float = 0.5
    rollout_tp: int = 1
    rollout_min_replicas: int = 1
    learner_min_gpus: int = 1
    granularity: int = 1
    max_gpus: int | None = None
    scaling_efficiency: float = 1.0
    sync_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not self.step_gpu_seconds > 0 or not math.isfinite(self.step_gpu_seconds):
            raise PlanningError(f"policy {self.name!r}: step_gpu_seconds must be a positive number, got "
                                f"{self.step_gpu_seconds}")
        if not 0.0 <= self.generate_fraction <= 1.0:
            raise PlanningError(f"policy {self.name!r}: generate_fraction must be in [0, 1], got "
                                f"{self.generate_fraction}")
        if min(self.rollout_tp, self.learner_min_gpus, self.granularity) < 1 or self.rollout_min_replicas < 0:
            raise PlanningError(f"policy {self.name!r}: rollout_tp, learner_min_gpus and granularity must be >= 1, "
                                "rollout_min_replicas >= 0")
        if self.rollout_min_replicas == 0 and self.generate_fraction > 0:
            raise PlanningError(f"policy {self.name!r}: without rollout replicas nothing generates (generate_fraction "
                                "must be 0)")
        if not 0.0 < self.scaling_efficiency <= 1.0:
            raise PlanningError(f"policy {self.name!r}: scaling_efficiency must be in (0, 1], got "
                                f"{self.scaling_efficiency}")
        if self.max_gpus is not None and self.max_gpus < self.min_gang:
            raise PlanningError(f"policy {self.name!r}: max_gpus {self.max_gpus} is below its minimum gang of "
                                f"{self.min_gang}")

    @property
    def min_rollout(self) -> int:
        """The fewest rollout GPUs: TP × minimum replicas."""
        return self.rollout_tp * self.rollout_min_replicas

    @property
    def min_gang(self) -> int:
        """The fewest GPUs the policy can run on at all (rollout and learner)."""
        return self.min_rollout + self.learner_min_gpus


@dataclass(frozen=True)
class Node:
    """A node and the GPUs free on it."""
    name: str
    gpus: int


@dataclass(frozen=True)
class Placement:
    """GPUs of one role of one policy on one node."""
    role: str  # "rollout" | "learner"
    replica: int
    node: str
    gpus: int


@dataclass(frozen=True)
class Allocation:
    """One policy's GPUs: rollout and learner counts, predicted step seconds and placements."""
    policy: str
    rollout_gpus: int
    learner_gpus: int
    predicted_step_seconds: float
    placements: tuple[Placement, ...] = ()

    @property
    def gpus(self) -> int:
        """Rollout and learner GPUs together."""
        return self.rollout_gpus + self.learner_gpus


@dataclass(frozen=True)
class Plan:
    """Every policy's allocation, the lower bound it is measured against, and why it was made."""
    allocations: dict[str, Allocation]
    total_gpus: int
    lower_bound_step_seconds: float
    generation: int = 0
    reason: str = "initial"

    @property
    def predicted_step_seconds(self) -> float:
        """The slowest policy's predicted step: the pace of a lockstep run."""
        return max(a.predicted_step_seconds for a in self.allocations.values())

    @property
    def allocated_gpus(self) -> int:
        """GPUs the plan uses."""
        return sum(a.gpus for a in self.allocations.values())

    @property
    def spare_gpus(self) -> int:
        """GPUs the plan leaves free."""
        return self.total_gpus - self.allocated_gpus

    @property
    def lower_bound_ratio(self) -> float:
        """Predicted step over the lower bound any plan could reach."""
        return self.predicted_step_seconds / self.lower_bound_step_seconds

    def counts(self) -> dict[str, int]:
        """GPUs per policy."""
        return {k: a.gpus for k, a in self.allocations.items()}

    def to_dict(self) -> dict:
        """The plan as JSON (API, CLI and metrics)."""
        return {
            "generation": self.generation, "reason": self.reason, "total_gpus": self.total_gpus,
            "spare_gpus": self.spare_gpus,
            "predicted_step_seconds": self.predicted_step_seconds,
            "lower_bound_step_seconds": self.lower_bound_step_seconds,
            "lower_bound_ratio": self.lower_bound_ratio,
            "policies": {
                k: {"rollout_gpus": a.rollout_gpus, "learner_gpus": a.learner_gpus,
                    "predicted_step_seconds": a.predicted_step_seconds,
                    "placements": [{"role": p.role, "replica": p.replica, "node": p.node,
                                    "gpus": p.gpus} for p in a.placements]}
                for k, a in self.allocations.items()
            },
        }


# ---- step-time model --------------------------------------------------------------------------

def speed(gpus: int, efficiency: float) -> float:
    """Throughput on ``gpus`` GPUs relative to one: 1 + eta*(g - 1)."""
    return 1.0 + efficiency * (gpus - 1) if gpus > 0 else 0.0


def role_times(d: PolicyDemand, rollout: int, learner: int, cost_scale: float = 1.0) -> tuple[float, float]:
    """(generation seconds, training seconds) of one step on this split."""
    w = d.step_gpu_seconds * cost_scale
    if d.generate_fraction <= 0:
        gen = 0.0
    else:
        gen = d.generate_fraction * w / speed(rollout, d.scaling_efficiency) if rollout > 0 else math.inf
    train = (1.0 - d.generate_fraction) * w / speed(learner, d.scaling_efficiency) if d.generate_fraction < 1 else 0.0
    return gen, train


def step_seconds(d: PolicyDemand, rollout: int, learner: int, cost_scale: float = 1.0) -> float:
    """Generation of the next step overlaps training of this one (bounded staleness), so a step
    takes the longer of the two, plus the weight sync that neither hides."""
    gen, train = role_times(d, rollout, learner, cost_scale)
    return max(gen, train) + d.sync_seconds


def best_split(d: PolicyDemand, gpus: int) -> tuple[int, int, float]:
    """(rollout, learner, step seconds) for ``gpus`` GPUs, rollout a multiple of the TP size.

    The balance point f/speed(r) = (1-f)/speed(g-r) is solved in closed form; the TP-grid
    neighbours on either side of it are compared (O(1), so planning 1,024 GPUs stays fast).
    """
    if gpus < d.min_gang:
        raise PlanningError(f"policy {d.name!r}: {gpus} GPUs is below its minimum gang of {d.min_gang}")
    tp, eta, f = d.rollout_tp, d.scaling_efficiency, d.generate_fraction
    r_lo, r_hi = d.min_rollout, ((gpus - d.learner_min_gpus) // tp) * tp
    ideal = (f * eta * gpus + 2 * f - 1 + eta * (1 - 2 * f)) / eta
    candidates = {r_lo, r_hi}
    for base in (math.floor(ideal / tp) * tp, math.ceil(ideal / tp) * tp):
        candidates.add(min(r_hi, max(r_lo, base)))
    best = min(((step_seconds(d, r, gpus - r), r) for r in candidates), key=lambda t: (t[0], -t[1]))
    return best[1], gpus - best[1], best[0]


def predict(d: PolicyDemand, gpus: int) -> float:
    """A policy's predicted step seconds on ``gpus`` GPUs, at its best rollout/learner split."""
    return best_split(d, gpus)[2]


def lower_bound_step_seconds(demands: Sequence[PolicyDemand], total_gpus: int) -> float:
    """max(sum W / G, max_k W_k / min(G, M_k) + sync_k): no plan's step is shorter."""
    spread = sum(d.step_gpu_seconds for d in demands) / total_gpus
    single = max(d.step_gpu_seconds / min(total_gpus, d.max_gpus or total_gpus) + d.sync_seconds for d in demands)
    return max(spread, single)


# ---- counts: water-filling --------------------------------------------------------------------

def check_fits(demands: Sequence[PolicyDemand], total_gpus: int) -> None:
    """A PlanningError when the policies' minimum gangs need more GPUs than there are."""
    need = sum(d.min_gang for d in demands)
    if need > total_gpus:
        gangs = ", ".join(f"{d.name} {d.min_gang}" for d in demands)
        raise PlanningError(f"the minimum gangs need {need} GPUs but only {total_gpus} are available (short by "
                            f"{need - total_gpus}: {gangs})")


def water_fill(demands: Sequence[PolicyDemand], total_gpus: int) -> dict[str, int]:
    """GPUs per policy minimising the largest predicted step time."""
    check_fits(demands, total_gpus)
    counts = {d.name: d.min_gang for d in demands}
    free = total_gpus - sum(counts.values())
    by_name = {d.name: d for d in demands}
    heap = [(-predict(d, counts[d.name]), i, d.name) for i, d in enumerate(demands)]
    heapq.heapify(heap)
    while heap:
        _, i, name = heapq.heappop(heap)
        d = by_name[name]
        nxt = counts[name] + d.granularity
        if d.granularity > free or (d.max_gpus is not None and nxt > d.max_gpus):
            break  # the slowest policy cannot get faster: the maximum is final
        counts[name], free = nxt, free - d.granularity
        heapq.heappush(heap, (-predict(d, nxt), i, name))
    # give back units that buy nothing (a plateau of the split), so spare GPUs stay spare
    for d in demands:
        while counts[d.name] - d.granularity >= d.min_gang and predict(d, counts[d.name] - d.granularity) <= predict(d,
                counts[d.name]):
            counts[d.name] -= d.granularity
    return counts


def evaluate_counts(demands: Sequence[PolicyDemand], counts: Mapping[str, int]) -> float:
    """The predicted step of the fleet (its slowest policy) for given per-policy GPU counts."""
    return max(predict(d, counts[d.name]) for d in demands)


# ---- placement: first-fit-decreasing ----------------------------------------------------------

def pack(demands: Sequence[PolicyDemand], splits: Mapping[str, tuple[int, int]],
         nodes: Sequence[Node]) -> dict[str, tuple[Placement, ...]]:
    """Place each policy's rollout replicas (TP groups, never split) and learner GPUs on nodes.

    Items are placed largest first into the first node with room; a learner larger than a node
    is cut into node-sized pieces (data-parallel ranks may span nodes, TP groups may not).
    """
    free = {n.name: n.gpus for n in nodes}
    order = [n.name for n in nodes]
    biggest = max((n.gpus for n in nodes), default=0)
    items: list[tuple[int, str, str, int]] = []
    for d in demands:
        r, l = splits[d.name]
        items += [(d.rollout_tp, d.name, "rollout", i) for i in range(r // d.rollout_tp)]
        left, piece = l, 0
        while left > 0:
            size = min(left, biggest) if biggest else left
            items.append((size, d.name, "learner", piece))
            left, piece = left - size, piece + 1
    items.sort(key=lambda t: (-t[0], t[1], t[2], t[3]))
    out: dict[str, list[Placement]] = {d.name: [] for d in demands}
    for size, name, role, idx in items:
        node = next((n for n in order if free[n] >= size), None)
        if node is None:
            raise PlanningError(f"cannot place {name} {role} group of {size} GPUs: no node has {size} free "
                                f"({sum(free.values())} free in all)")
        free[node] -= size
        out[name].append(Placement(role, idx, node, size))
    return {k: tuple(v) for k, v in out.items()}


def make_plan(demands: Sequence[PolicyDemand], nodes: Sequence[Node] | int, generation: int = 0,
              reason: str = "initial") -> Plan:
    """The whole plan: counts by water-filling, splits, and a node placement that fits.

    When fragmentation defeats the packing, the budget is lowered one GPU at a time and the
    counts recomputed (a plan on fewer GPUs that places beats one that does not).
    """
    if not demands:
        raise PlanningError("no policies to plan")
    names = [d.name for d in demands]
    if len(set(names)) != len(names):
        raise PlanningError(f"policy names must be unique: {names}")
    node_list = [Node(f"node-{i}", 8) for i in range(math.ceil(nodes / 8))] if isinstance(nodes, int) else list(nodes)
    if isinstance(nodes, int) and nodes % 8:
        node_list[-1] = Node(node_list[-1].name, nodes % 8)
    total = sum(n.gpus for n in node_list)
    for d in demands:
        if d.rollout_tp > max((n.gpus for n in node_list), default=0):
            raise PlanningError(f"policy {d.name!r}: a tensor-parallel group of {d.rollout_tp} GPUs fits on no node "
                                f"(largest has {max((n.gpus for n in node_list), default=0)})")
    check_fits(demands, total)
    budget = total
    last_error: PlanningError | None = None
    while budget >= sum(d.min_gang for d in demands):
        counts = water_fill(demands, budget)
        splits = {d.name: best_split(d, counts[d.name])[:2] for d in demands}
        try:
            placements = pack(demands, splits, node_list)
        except PlanningError as e:
            last_error, budget = e, budget - 1
            continue
        allocs = {
            d.name: Allocation(d.name, splits[d.name][0], splits[d.name][1], step_seconds(d, *splits[d.name]),
                               placements[d.name])
            for d in demands
        }
        return Plan(allocs, total, lower_bound_step_seconds(demands, total), generation, reason)
    raise last_error or PlanningError("no placement fits")


# ---- re-planning ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReplanDecision:
    """Whether to move to a candidate plan, the predicted gain and the reason."""
    replan: bool
    reason: str
    gain: float
    current_step_seconds: float
    candidate_step_seconds: float


CALIBRATION_GAIN = 0.03
"""The bar for a calibration plan: one that replaces seeded guesses (model size and tokens), or the
one-sample measurement that replaced them, with better-measured costs. Those guesses may be off by
far more than the 10 % hysteresis meant for cost drift, so such a plan needs only a small predicted
gain and to pay for its move."""

MAX_HORIZON_STEPS = 25.0
"""How far ahead a plan projects the measured trend: halfway through the remaining steps (a linear
drift's mean over them), but no further than this — a slope read from a 60-step window is too noisy
to extrapolate a hundred steps."""


def planning_horizon(remaining_steps: float, max_steps: float = MAX_HORIZON_STEPS) -> float:
    """Steps ahead whose projected costs a plan is made for."""
    return min(max_steps, remaining_steps / 2)


@dataclass(frozen=True)
class Judgement:
    """How the next plan made from measurements is judged: its reason, the predicted gain it must
    beat, and whether its costs come from the least-squares line over the window's measurements
    (precise) rather than the exponential average (quick to follow drift)."""
    reason: str  # "measured" (a calibration) | "cost_drift"
    min_gain: float
    window_fit: bool = False


@dataclass
class ReplanSchedule:
    """Which bar the next plan made from measurements must clear, and when a plan may be judged at all
    (docs/mwra.md, "Planning").

    Two calibrations, each judged once, adopted or not: the first measurement of every policy (it
    corrects seeding errors of tens of percent), then the first time every policy has
    :data:`CALIBRATION_STEPS` measurements — a single step's cost carries the response-length noise (about
    8 % per step), so the first calibration can leave a plan one GPU off, which the 10 % hysteresis would
    keep for the rest of the run. Between them nothing is judged: an average of a few noisy steps is not
    drift. After them every judgement is cost drift under the experiment's ``min_gain``. After any move
    (:meth:`moved`) no cost-drift judgement happens for ``dwell`` measurements, so steady costs move gangs
    at most once per dwell however the noise falls; the second calibration is not held by it.

    The hysteresis is also a trap: a plan the first calibration left a GPU off can show a steady 9 % gain
    that never clears a 10 % bar. Noise does not hold still, so a gain above half the bar in
    :data:`SUSTAINED_JUDGEMENTS` cost-drift judgements in a row (:meth:`judged`) is taken as real, and the
    next judgement's bar is halved. The controller and the simulator each hold one, so the rule the
    simulator proves is the rule the controller runs."""
    min_gain: float = 0.10
    calibration_gain: float = CALIBRATION_GAIN
    dwell: int = 0  # measurements (a policy's step each) to wait after a move before judging again
    calibrations: int = 0  # judged so far: 0, 1 (first measurement) or 2 (CALIBRATION_STEPS measurements)
    since_move: int = 10 ** 9
    sustained: int = 0  # cost-drift judgements in a row, since the last move, whose gain cleared half the bar

    def next(self, calibration_ready: bool) -> Judgement | None:
        """The next judgement (None: do not judge now): a calibration on first measurements, another once every
        policy has :data:`CALIBRATION_STEPS` measurements (``calibration_ready``), then the configured gain bar;
        no cost-drift judgement within ``dwell`` measurements of a move. The second calibration is outside the
        dwell: it is judged once whatever happens, and a plan the noisy first one left a GPU off is corrected
        at step ~20 instead of waiting out the dwell."""
        self.since_move += 1
        if self.calibrations == 0:
            self.calibrations = 1
            return Judgement("measured", self.calibration_gain)
        if self.calibrations == 1:
            if not calibration_ready:
                return None
            self.calibrations = 2
            return Judgement("measured", self.calibration_gain, window_fit=True)
        if self.since_move <= self.dwell:
            return None
        if self.sustained >= SUSTAINED_JUDGEMENTS:
            return Judgement("cost_drift", self.min_gain / 2)
        return Judgement("cost_drift", self.min_gain)

    def judged(self, judgement: Judgement, gain: float) -> None:
        """The predicted gain of the candidate a cost-drift judgement turned down (or took)."""
        if judgement.reason == "cost_drift":
            self.sustained = self.sustained + 1 if gain > self.min_gain / 2 else 0

    def moved(self) -> None:
        """A plan was adopted (or forced): the dwell starts again, and no gain is sustained yet."""
        self.since_move = 0
        self.sustained = 0


CALIBRATION_STEPS = 20
"""Measurements of every policy before the second calibration. Their mean (no trend is read before the window is
full) has about a fifth of one step's response-length noise (8 % a step in the simulator → ~2 %), enough to place
whole GPUs."""

SUSTAINED_JUDGEMENTS = 60
"""Cost-drift judgements in a row (a policy's step each) whose gain must clear half of ``min_gain`` before the bar
is halved: a full window of measurements, long enough that the response-length noise has turned over several
times."""

DWELL_STEPS = 50
"""Steps (of every policy) a plan is kept before cost drift may move it again: at most one move per 50 steps
when costs are steady, where each move costs a pod start, a model load and a weight sync."""


def decide_replan(
    demands: Sequence[PolicyDemand], current: Plan, candidate: Plan, remaining_steps: int, move_cost_s: float,
    min_gain: float = 0.10,
) -> ReplanDecision:
    """Move only when it pays: the candidate must be > ``min_gain`` faster per step under the
    *same* (newly measured) costs, and the seconds it saves over the remaining steps must exceed
    the cost of moving (pod start, model load, weight sync)."""
    by_name = {d.name: d for d in demands}
    cur = max(step_seconds(by_name[k], a.rollout_gpus, a.learner_gpus) for k, a in current.allocations.items())
    new = candidate.predicted_step_seconds
    gain = 1.0 - new / cur if cur > 0 else 0.0

    def split(p: Plan, k: str) -> tuple[int, int]:
        return p.allocations[k].rollout_gpus, p.allocations[k].learner_gpus

    unchanged = candidate.counts() == current.counts() and all(split(candidate, k) == split(current, k)
                                                               for k in candidate.allocations)
    if unchanged:
        return ReplanDecision(False, "unchanged", 0.0, cur, new)
    if gain <= min_gain:
        return ReplanDecision(False, f"gain {gain:.1%} <= {min_gain:.0%}", gain, cur, new)
    saved = (cur - new) * remaining_steps
    if saved <= move_cost_s:
        return ReplanDecision(False, f"saves {saved:.0f}s <= move cost {move_cost_s:.0f}s", gain, cur, new)
    return ReplanDecision(True, "cost_drift", gain, cur, new)


# ---- costs: seeded, then measured -------------------------------------------------------------

def seed_step_cost(params: float, tokens_per_step: float, gpu_flops: float = 400e12, train_mfu: float = 0.35,
                   generate_mfu: float = 0.05) -> tuple[float, float]:
    """(W GPU-seconds, generate fraction) from model size and tokens before anything is measured:
    training is ~6 FLOPs per parameter per token, generation ~2 at a far lower utilisation
    (decoding is memory-bound). Replaced by measured step times as soon as they arrive."""
    train = 6.0 * params * tokens_per_step / (gpu_flops * train_mfu)
    gen = 2.0 * params * tokens_per_step / (gpu_flops * generate_mfu)
    return gen + train, gen / (gen + train)


@dataclass
class MeasuredCosts:
    """Each policy's measured W and generate fraction: an exponential average for the level and
    a least-squares slope over the last ``window`` steps for the trend, so a plan can be made for
    the costs *ahead* (responses lengthen as training goes on) rather than the step just measured.
    The line's own level, more precise and slower, serves the full-window calibration.

    A measurement is the stage seconds of one step on a known split: generation took
    ``generate_s`` on ``rollout`` GPUs, log-probs + training ``train_s`` on ``learner`` GPUs.
    Multiplying by the speed of each role turns them back into one-GPU seconds.
    """

    alpha: float = 0.2
    window: int = 60
    values: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (W level, f)
    history: dict[str, list[float]] = field(default_factory=dict)  # name -> recent W measurements

    def observe(self, d: PolicyDemand, rollout: int, learner: int, generate_s: float, train_s: float,
                sync_s: float = 0.0) -> None:
        """Fold one measured step (seconds per stage on its split) into the policy's cost estimate."""
        gen_w = generate_s * speed(rollout, d.scaling_efficiency)
        train_w = train_s * speed(learner, d.scaling_efficiency)
        w = gen_w + train_w
        if w <= 0 or not math.isfinite(w):
            return
        f = gen_w / w
        hist = self.history.setdefault(d.name, [])
        hist.append(w)
        del hist[: -self.window]
        if d.name in self.values:
            w0, f0 = self.values[d.name]
            w, f = w0 + self.alpha * (w - w0), f0 + self.alpha * (f - f0)
        self.values[d.name] = (w, f)

    def _fit(self, name: str) -> tuple[float, float, float, int]:
        """(mean, slope, slope's standard error, n) of the least-squares line over the window."""
        ys = self.history.get(name, [])
        n = len(ys)
        if n < 3:
            return (sum(ys) / n if n else 0.0), 0.0, math.inf, n
        mx, my = (n - 1) / 2, sum(ys) / n
        sxx = sum((i - mx) ** 2 for i in range(n))
        slope = sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sxx
        resid = sum((y - (my + slope * (i - mx))) ** 2 for i, y in enumerate(ys))
        return my, slope, math.sqrt(resid / (n - 2) / sxx), n

    def _clear_of_noise(self, slope: float, stderr: float, n: int) -> float:
        return slope if n >= self.window and abs(slope) > 3 * stderr else 0.0

    def trend(self, name: str) -> float:
        """W change per step: the least-squares slope of a full window of measurements, or 0 unless it
        stands clear of the noise (|slope| > 3 standard errors). A trend read from noise would move gangs
        for nothing, and it is projected over the planning horizon, so its error grows with it: over 30 steps,
        judged again at every step, a 4.5-standard-error slope of pure noise turned up and moved a run's
        gangs there and back (docs/mwra.md); before the window is full the level alone is used."""
        _, slope, stderr, n = self._fit(name)
        return self._clear_of_noise(slope, stderr, n)

    def window_level(self, name: str) -> float:
        """W now, read from the line over the window: the window's mean, moved to its newest step
        along the trend. Over a full window its noise is about 0.4 of the exponential average's
        (60 samples against an effective 9 at alpha 0.2)."""
        mean, slope, stderr, n = self._fit(name)
        return mean + self._clear_of_noise(slope, stderr, n) * (n - 1) / 2

    def window_full(self, names: Sequence[str]) -> bool:
        """Whether every named policy has a full window of measurements."""
        return self.has(names, self.window)

    def has(self, names: Sequence[str], n: int) -> bool:
        """Whether every named policy has at least ``n`` measurements in the window."""
        return all(len(self.history.get(name, [])) >= min(n, self.window) for name in names)

    def apply(self, demands: Sequence[PolicyDemand], horizon_steps: float = 0.0,
              window_fit: bool = False) -> list[PolicyDemand]:
        """The demands with measured costs, projected ``horizon_steps`` ahead along the trend; the
        level is the exponential average, or with ``window_fit`` the line over the window."""
        out = []
        for d in demands:
            if d.name in self.values:
                w, f = self.values[d.name]
                if window_fit:
                    w = self.window_level(d.name)
                if horizon_steps:
                    w = max(0.5 * w, w + self.trend(d.name) * horizon_steps)
                d = replace(d, step_gpu_seconds=w, generate_fraction=min(1.0, max(0.0, f)))
            out.append(d)
        return out
