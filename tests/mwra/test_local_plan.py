"""`mutualrl up`'s single-host plan: placed gangs when they fit, shared GPUs when they do not, cores on a CPU."""

from __future__ import annotations

import pytest

from mutualrl.services.mwra.local import plan_cpu_host, plan_gpu_host
from mutualrl.services.mwra.planner import PlanningError, PolicyDemand


def _demand(name: str, tp: int = 1, learner: int = 1) -> PolicyDemand:
    return PolicyDemand(name, 1.0, rollout_tp=tp, learner_min_gpus=learner, granularity=tp)


def test_gangs_that_fit_get_devices_of_their_own():
    plan = plan_gpu_host([_demand("a"), _demand("b")], gpus=4, cores=16)
    ids = [plan.assignments[(p, r)].cuda_visible_devices for p in ("a", "b") for r in ("rollout", "learner")]
    assert sorted(ids) == ["0", "1", "2", "3"] and plan.shared is None and plan.plan is not None


def test_one_gpu_is_shared_by_every_service_and_the_plan_says_so():
    plan = plan_gpu_host([_demand("a"), _demand("b")], gpus=1, cores=16)
    assert {a.cuda_visible_devices for a in plan.assignments.values()} == {"0"}
    assert len(plan.assignments) == 4 and plan.plan is None
    assert "need 4 GPUs and this host has 1" in plan.shared
    assert any(line.startswith("  GPUs shared:") for line in plan.lines())
    assert plan.assignments[("a", "learner")].env()["CUDA_VISIBLE_DEVICES"] == "0"


def test_shared_policies_are_dealt_round_the_gpus_with_both_roles_together():
    plan = plan_gpu_host([_demand("a"), _demand("b", tp=2), _demand("c")], gpus=3, cores=12)
    on = {p: plan.assignments[(p, "rollout")].cuda_visible_devices for p in "abc"}
    assert on == {"a": "0", "b": "1,2", "c": "0"}
    assert all(plan.assignments[(p, "learner")].cuda_visible_devices == on[p] for p in "abc")


def test_a_policy_wider_than_the_host_is_refused_in_one_line():
    with pytest.raises(PlanningError) as e:
        plan_gpu_host([_demand("a"), _demand("big", learner=3)], gpus=2, cores=8)
    assert "'big' needs 3 GPUs at once" in str(e.value) and "this host has 2" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_cpu_host_shares_cores_and_names_no_devices():
    plan = plan_cpu_host([_demand("a"), _demand("b")], cores=2)
    assert all(a.cuda_visible_devices is None and a.threads == 1 for a in plan.assignments.values())


def test_without_sharing_gangs_that_do_not_fit_are_refused():
    """The compose file's gpu profile: each vLLM engine holds most of its GPU's memory, so nothing shares it."""
    with pytest.raises(PlanningError, match="minimum gangs need 4 GPUs but only 1"):
        plan_gpu_host([_demand("a"), _demand("b")], gpus=1, cores=8, share=False)
