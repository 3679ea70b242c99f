"""The simulator's accounting and the strategies' ordering on small scenarios."""

from __future__ import annotations

import pytest

from mutualrl.services.mwra.planner import PolicyDemand
from mutualrl.services.mwra.simulator import (
    EqualSplit,
    Mwra,
    Scenario,
    SimPolicy,
    best_static_counts,
    build_scenario,
    compare,
    run,
)


def test_lockstep_makespan_by_hand():
    # two policies, W 8 and 8, f 0.5, no noise, no drift, 4 GPUs: each 1+1, step max(4, 4) = 4 s; 10 steps, staleness 0
    pol = tuple(SimPolicy(PolicyDemand(n, 8.0, 0.5), length_sigma=1e-9, samples_per_step=1) for n in ("a", "b"))
    sc = Scenario(pol, gpus=4, steps=10, staleness=0)
    r = run(sc, EqualSplit())
    assert r.makespan_s == pytest.approx(40.0, rel=1e-6)
    assert r.lower_bound_s == pytest.approx(160.0 / 4, rel=1e-6)  # all work 160 GPU-s over 4 GPUs
    assert r.utilisation == pytest.approx(1.0, rel=1e-6)
    assert r.partial_gang_gpu_seconds == 0.0 and r.peer_lag_steps <= 1


def test_equal_split_below_a_minimum_gang_stalls_and_counts_partial_time():
    pol = (SimPolicy(PolicyDemand("a", 1.0, rollout_tp=2)), SimPolicy(PolicyDemand("b", 1.0)))
    r = run(Scenario(pol, gpus=4, steps=10), EqualSplit())  # 2 GPUs each, a needs 3
    assert r.stalled and r.makespan_s is None and r.partial_gang_gpu_seconds > 0


def test_mwra_beats_equal_split_at_uneven_costs_and_never_holds_partial_gangs():
    res = compare(build_scenario(3, 24, 10, seed=0, steps=120))
    assert res["mwra"].partial_gang_gpu_seconds == 0
    assert res["equal"].makespan_s / res["mwra"].makespan_s >= 1.3
    assert res["mwra"].makespan_s <= 1.05 * res["best_static"].makespan_s


def test_best_static_search_covers_every_vector():
    sc = build_scenario(2, 8, 4, seed=0, steps=20, drift=0.0)
    top = best_static_counts([p.demand for p in sc.policies], sc.costs(), 8, 1, top=100)
    assert len(top) == 5  # a: 2..6, b takes the rest (>= 2)
    assert all(sum(c.values()) == 8 for c in top)


def test_node_loss_replans_once_and_recovers():
    sc = build_scenario(4, 32, 4, seed=1, steps=150, node_loss_step=60)
    r = run(sc, Mwra(sc.move_cost_s))
    assert r.partial_gang_gpu_seconds == 0
    assert r.post_loss_over_new_lower_bound is not None and r.post_loss_over_new_lower_bound < 1.5


def test_steady_costs_replan_at_most_once_per_50_steps():
    for seed in range(3):
        sc = build_scenario(4, 32, 4, seed=seed, steps=200, drift=0.0)
        assert run(sc, Mwra(sc.move_cost_s)).replans <= 200 // 50


def test_the_gang_aware_bound_by_hand():
    """Two policies on 6 GPUs, no noise, no drift: a with work 8 GPU-s a step and generation half of it on TP 2
    (its gang: 2 + 1 = 3), b with work 1 (gang 1 + 1 = 2), 10 steps. The plain bound spreads all 90 GPU-s over
    6 GPUs: 15 s. With whole gangs, b holds 2 GPUs however little it does, so a gets 4 at most, split 2 + 2:
    generation 40 GPU-s on 2 GPUs = 20 s, training 40 on 2 = 20 s; the bound is 20 s, and so is the best run."""
    from mutualrl.services.mwra.simulator import FixedPlan, gang_lower_bound

    pol = (SimPolicy(PolicyDemand("a", 8.0, 0.5, rollout_tp=2), length_sigma=1e-9, samples_per_step=1),
           SimPolicy(PolicyDemand("b", 1.0, 0.5), length_sigma=1e-9, samples_per_step=1))
    sc = Scenario(pol, gpus=6, steps=10, staleness=0)
    truth = [p.demand for p in pol]
    assert gang_lower_bound(truth, sc.costs(), 6) == pytest.approx(20.0, rel=1e-6)
    r = run(sc, FixedPlan({"a": 4, "b": 2}))
    assert r.lower_bound_s == pytest.approx(15.0, rel=1e-6)
    assert r.makespan_s == pytest.approx(20.0, rel=1e-6) and r.makespan_over_gang_bound == pytest.approx(1.0)
    # on 5 GPUs a gets 3: 2 rollout (its TP group) + 1 learner, training 40 GPU-s on 1 GPU = 40 s
    assert gang_lower_bound(truth, sc.costs(), 5) == pytest.approx(40.0, rel=1e-6)
    assert gang_lower_bound(truth, sc.costs(), 4) == float("inf")  # the gangs need 5
