"""One interface for every place MWRA can put gangs: the planning logic never knows which."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from typing_extensions import override

from mutualrl.config.kubernetes import ModelsConfig, PodConfig
from mutualrl.services.mwra.planner import Node, Plan


@dataclass(frozen=True)
class RunSpec:
    """What a backend needs besides the plan: the run's id and its experiment file."""

    run: str
    config_yaml: str
    namespace: str = "default"
    image: str = ""
    queue: str = "mutualrl"
    redis_url: str | None = None
    redis_url_secret: str | None = None
    weights_claim: str | None = None
    hmac_secret: str | None = None
    resources: dict[str, dict] = field(default_factory=dict)  # policy -> {"cpu": ..., "memory": ...}
    # policy -> {"backend", "model", "tp", "image", "args"} (external engines)
    engines: dict[str, dict] = field(default_factory=dict)
    # Secret with one password per "<policy>.<role>": each pod's own Redis identity
    redis_users_secret: str | None = None
    # "<policy>.<role>" -> its SEE signing key (a per-run Secret)
    see_keys: dict[str, str] = field(default_factory=dict)
    # the collective weights transport: the port each learner hosts its weight group on (None: filesystem)
    weights_port: int | None = None
    # policy -> where and how its pods run (resources, node selection, probes); a policy not named gets defaults
    pods: dict[str, PodConfig] = field(default_factory=dict)
    # the model volume at /models, HF_HOME and the HF token
    models: ModelsConfig = field(default_factory=ModelsConfig)
    # "<policy>.<role>" -> the PVC at /data (checkpoints, learner state, the rollout ledger)
    state_claims: dict[str, str] = field(default_factory=dict)
    image_pull_secrets: tuple[str, ...] = ()
    # a Secret whose keys are the learners' tracker credentials (docs/tracking.md)
    tracking_secret: str | None = None

    @classmethod
    def from_config(cls, run: str, yaml_text: str, cfg, see_keys: dict[str, str]) -> "RunSpec":
        """The spec of an experiment (an ``ExperimentConfig``) as its file's Kubernetes sections say."""
        k = cfg.mwra.kubernetes
        return cls(
            run, yaml_text, k.namespace, k.image, k.queue, k.redis_url, k.redis_url_secret, k.weights_claim,
            k.hmac_secret, resources={p.name: {"cpu": p.resources.cpu, "memory": p.resources.memory}
                                      for p in cfg.policies},
            engines={p.name: {"backend": p.engine.backend, "model": p.model.path or "", "tp": p.resources.rollout_tp,
                              "image": p.resources.engine_image, "args": list(p.resources.engine_args)}
                     for p in cfg.policies if not p.engine.facts.in_process},
            redis_users_secret=k.redis_users_secret, see_keys=see_keys,
            weights_port=cfg.weights.port if cfg.weights.transport == "collective" else None,
            pods={p.name: p.kubernetes for p in cfg.policies}, models=k.models, state_claims=dict(k.state_claims),
            image_pull_secrets=tuple(k.image_pull_secrets), tracking_secret=k.tracking_secret)


@dataclass(frozen=True)
class BackendEvent:
    """Something the cluster did that the controller must react to.

    kind: ``pod_recreated`` (a failed or deleted member was replaced), ``node_lost``,
    ``gang_admitted`` (all members running; ``seconds`` waited), ``gang_evicted``.
    """

    kind: str
    run: str = ""
    policy: str = ""
    detail: str = ""
    seconds: float = 0.0


class Backend(ABC):
    """Where gangs run: applies a plan's gangs whole, deletes a run, reports nodes and events."""
    name = "backend"

    @abstractmethod
    def nodes(self) -> list[Node]:
        """Allocatable GPUs per node that this controller may plan on."""

    @abstractmethod
    def apply(self, spec: RunSpec, plan: Plan) -> None:
        """Make the cluster hold exactly the plan's gangs for this run (all of a gang or none)."""

    @abstractmethod
    def delete(self, run: str) -> None:
        """Remove every object of the run."""

    @abstractmethod
    def poll(self) -> list[BackendEvent]:
        """Reconcile once: repair what drifted and report what happened since the last call."""

    def record_event(self, spec: RunSpec, reason: str, message: str, kind: str = "Normal") -> None:
        """Tell a person what MWRA decided (Kubernetes Events); backends without such a record
        keep nothing."""


class InMemoryBackend(Backend):
    """A cluster in a dict, for the controller's planning logic in tests: nodes can be lost,
    gangs are admitted whole when they fit, and partial gangs are impossible by construction."""

    name = "memory"

    def __init__(self, nodes: list[Node]):
        self._nodes = {n.name: n for n in nodes}
        self.gangs: dict[tuple[str, str], dict] = {}  # (run, policy) -> {"plan_generation", "placements"}
        self._events: list[BackendEvent] = []

    @override
    def nodes(self) -> list[Node]:
        return list(self._nodes.values())

    @override
    def apply(self, spec: RunSpec, plan: Plan) -> None:
        for key in [k for k in self.gangs if k[0] == spec.run and k[1] not in plan.allocations]:
            del self.gangs[key]
        for name, alloc in plan.allocations.items():
            if any(p.node not in self._nodes for p in alloc.placements):
                raise RuntimeError(f"plan places {name} on a node this cluster does not have")
            self.gangs[(spec.run, name)] = {"plan_generation": plan.generation, "placements": alloc.placements}
            self._events.append(BackendEvent("gang_admitted", spec.run, name))

    @override
    def delete(self, run: str) -> None:
        for key in [k for k in self.gangs if k[0] == run]:
            del self.gangs[key]

    @override
    def poll(self) -> list[BackendEvent]:
        out, self._events = self._events, []
        return out
