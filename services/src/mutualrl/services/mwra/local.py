"""MWRA's local backend: `mutualrl up` on one host takes its assignment from the planner.

On a GPU host each service gets the devices of its placement as ``CUDA_VISIBLE_DEVICES``. A host with
fewer GPUs than the policies' minimum gangs (one workstation GPU, two policies) is shared instead: both
services of a policy run on the same device(s), the policies dealt round the GPUs in turn, and the plan
says so (placement by MWRA needs gangs that fit). On a CPU host the "GPUs" are cores: a policy's
rollout and learner alternate within a step, so both services of a policy get the policy's share of
cores as torch/OpenMP threads (never more cores in use than the host has, which is what keeps torch's
spinning threads from thrashing).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from mutualrl.services.mwra.planner import Node, Plan, PlanningError, PolicyDemand, make_plan, water_fill


@dataclass(frozen=True)
class ServiceAssignment:
    """What one local service gets: GPUs (CUDA_VISIBLE_DEVICES) or CPU threads."""
    policy: str
    role: str
    threads: int
    cuda_visible_devices: str | None = None

    def env(self) -> dict[str, str]:
        """The environment a service runs with: its threads and, on a GPU host, its devices."""
        env = {"MUTUALRL_TORCH_THREADS": str(self.threads), "OMP_NUM_THREADS": str(self.threads)}
        if self.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.cuda_visible_devices
        return env


@dataclass(frozen=True)
class LocalPlan:
    """The assignment of every service of `mutualrl up` on this host."""
    plan: Plan | None  # None on a CPU host and on shared GPUs
    assignments: dict[tuple[str, str], ServiceAssignment]
    device: str  # "gpu" | "cpu"
    units: int
    shared: str | None = None  # why the GPUs are shared (too few for the minimum gangs), else None

    def lines(self) -> list[str]:
        """The plan as lines for the console."""
        out = [f"plan ({self.device}, {self.units} {'GPUs' if self.device == 'gpu' else 'cores'}):"]
        if self.shared:
            out.append(f"  GPUs shared: {self.shared}")
        for (policy, role), a in sorted(self.assignments.items()):
            where = f"CUDA_VISIBLE_DEVICES={a.cuda_visible_devices}" if a.cuda_visible_devices is not None else "cpu"
            out.append(f"  {policy}.{role}: {where}, {a.threads} threads")
        if self.plan is not None:
            out.append(f"  predicted step {self.plan.predicted_step_seconds:.2f}s, {self.plan.lower_bound_ratio:.2f}x "
                       f"the lower bound, {self.plan.spare_gpus} spare")
        return out


def plan_gpu_host(demands: Sequence[PolicyDemand], gpus: int, cores: int, share: bool = True) -> LocalPlan:
    """One node of ``gpus`` devices; device indices handed out per placement, in order. Too few GPUs for
    the minimum gangs: :func:`plan_shared_gpus`, or with ``share=False`` a PlanningError (a compose file's
    vLLM engines each take most of a GPU's memory, so nothing may share theirs)."""
    threads = max(1, cores // (2 * len(demands)))
    need = sum(d.min_gang for d in demands)
    if need > gpus and share:
        return plan_shared_gpus(demands, gpus, threads, need)
    plan = make_plan(demands, [Node("local", gpus)])
    assignments: dict[tuple[str, str], ServiceAssignment] = {}
    nxt = 0
    for name, alloc in plan.allocations.items():
        for role, count in (("rollout", alloc.rollout_gpus), ("learner", alloc.learner_gpus)):
            ids = ",".join(str(i) for i in range(nxt, nxt + count))
            nxt += count
            assignments[(name, role)] = ServiceAssignment(name, role, threads, ids)
    return LocalPlan(plan, assignments, "gpu", gpus)


def plan_shared_gpus(demands: Sequence[PolicyDemand], gpus: int, threads: int, need: int) -> LocalPlan:
    """Both services of each policy on the same ``width`` devices (the larger of its rollout TP and learner
    GPUs), the policies dealt round the host's GPUs in turn. What does not fit even so (a TP 2 engine on one
    GPU) is a PlanningError."""
    assignments: dict[tuple[str, str], ServiceAssignment] = {}
    start = 0
    for d in demands:
        width = max(d.rollout_tp, d.learner_min_gpus)
        if width > gpus:
            raise PlanningError(f"policy {d.name!r} needs {width} GPUs at once (rollout TP {d.rollout_tp}, learner "
                                f"{d.learner_min_gpus}) but this host has {gpus}")
        if start + width > gpus:
            start = 0
        ids = ",".join(str(i) for i in range(start, start + width))
        start = (start + width) % gpus
        for role in ("rollout", "learner"):
            assignments[(d.name, role)] = ServiceAssignment(d.name, role, threads, ids)
    why = (f"the minimum gangs need {need} GPUs and this host has {gpus}, so each policy's rollout and learner "
           "share its devices (no MWRA placement)")
    return LocalPlan(None, assignments, "gpu", gpus, shared=why)


def plan_cpu_host(demands: Sequence[PolicyDemand], cores: int) -> LocalPlan:
    """Cores water-filled by predicted step time. A policy's two services take turns on its
    cores, so each policy is one role of at least one core; with more policies than cores
    every service gets one thread."""
    if cores >= len(demands):
        shares = water_fill([_colocated(d) for d in demands], cores)
    else:
        shares = {d.name: 1 for d in demands}
    assignments = {}
    for d in demands:
        for role in ("rollout", "learner"):
            assignments[(d.name, role)] = ServiceAssignment(d.name, role, max(1, shares[d.name]))
    return LocalPlan(None, assignments, "cpu", cores)


def _colocated(d: PolicyDemand) -> PolicyDemand:
    return PolicyDemand(d.name, d.step_gpu_seconds, 0.0, rollout_min_replicas=0, learner_min_gpus=1,
                        scaling_efficiency=d.scaling_efficiency)


def visible_gpus() -> int:
    """How many CUDA devices this host shows (0 without torch or CUDA)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no usable CUDA is a CPU host
        return 0


def plan_local(demands: Sequence[PolicyDemand], gpus: int | None = None, cores: int | None = None) -> LocalPlan:
    """A single-host plan: devices per service on a GPU host, threads per service on a CPU host."""
    cores = cores or os.cpu_count() or 1
    gpus = gpus if gpus is not None else visible_gpus()
    return plan_gpu_host(demands, gpus, cores) if gpus else plan_cpu_host(demands, cores)
