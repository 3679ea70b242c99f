"""The Kubernetes objects of one policy gang, as plain dicts (pure functions, no client).

Per policy: one pod per rollout replica and one per learner piece, each with ``nvidia.com/gpu``
limits, a headless Service per role, labels ``mutualrl.io/{run,policy,role,plan-generation}``,
and an owner reference to the run's ConfigMap (which holds the experiment file), so deleting the
run deletes everything. The gang backend adds its own grouping:

- ``kueue``: plain pods in a pod group (``kueue.x-k8s.io/queue-name`` and ``pod-group-name``
  labels, ``pod-group-total-count`` annotation);
- ``kai``: a ``scheduling.run.ai/v2alpha2`` PodGroup, pods on ``kai-scheduler`` with the queue label;
- ``volcano``: a ``scheduling.volcano.sh/v1beta1`` PodGroup, pods on ``volcano`` with the
  ``scheduling.k8s.io/group-name`` annotation;
- ``native``: Kubernetes' own gang scheduling — a ``scheduling.k8s.io/v1alpha2`` PodGroup and
  ``spec.schedulingGroup`` on the pods (1.36+; 1.35's v1alpha1 ``workloadRef`` is gone from the
  current client, so a 1.35 cluster falls back to MWRA's own admission);
- ``mwra``: no grouping object; the controller admits a gang only when it fits the free GPUs.
"""

from __future__ import annotations

import hashlib
import re

from mutualrl.config.engines import ServerFacts, engine_facts
from mutualrl.config.kubernetes import PodConfig
from mutualrl.runtime.serve_args import serve_argv
from mutualrl.runtime.shard import REPLICA_ENV, REPLICAS_ENV
from mutualrl.see.identity import SEE_KEYS_ENV, key_env, services_read
from mutualrl.services.mwra.backends.base import RunSpec
from mutualrl.services.mwra.planner import Allocation

GANG_BACKENDS = ("kueue", "kai", "volcano", "native", "mwra")
ROLE_PORTS = {"rollout": [("grpc", 50051), ("ops", 9000)], "learner": [("ops", 9000)]}
GROUP_VERSIONS = {
    "kueue": ("kueue.x-k8s.io", "v1beta1"),
    "kai": ("scheduling.run.ai", "v2alpha2"),
    "volcano": ("scheduling.volcano.sh", "v1beta1"),
    "native": ("scheduling.k8s.io", "v1alpha2"),
}


def dns_name(*parts: str) -> str:
    """A DNS-1123 label (63 characters at most) from the parts. A name that must be cut keeps a hash of the
    whole, so two long names that share a prefix stay apart (the chart's ``mutualrl.name`` does the same)."""
    s = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    if len(s) <= 63:
        return s
    return f"{s[:54].rstrip('-')}-{hashlib.sha256(s.encode()).hexdigest()[:8]}"


def labels(spec: RunSpec, policy: str, role: str | None, generation: int) -> dict[str, str]:
    """The labels of every object of a run's policy (and role): who manages it, the run, the plan generation."""
    out = {"app.kubernetes.io/name": "mutualrl", "app.kubernetes.io/managed-by": "mutualrl-mwra",
           "mutualrl.io/run": spec.run, "mutualrl.io/policy": policy, "mutualrl.io/plan-generation": str(generation)}
    if role:
        out["mutualrl.io/role"] = role
    return out


def owner_reference(config_map: dict) -> dict:
    """An owner reference to the run's ConfigMap, so deleting it deletes the run's objects."""
    meta = config_map["metadata"]
    return {"apiVersion": "v1", "kind": "ConfigMap", "name": meta["name"], "uid": meta["uid"], "controller": True,
            "blockOwnerDeletion": True}


def config_map(spec: RunSpec) -> dict:
    """The run's ConfigMap: the experiment file every pod mounts."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": dns_name(spec.run, "config"), "namespace": spec.namespace,
                     "labels": {"app.kubernetes.io/name": "mutualrl", "app.kubernetes.io/managed-by": "mutualrl-mwra",
                                "mutualrl.io/run": spec.run}},
        "data": {"config.yaml": spec.config_yaml},
    }


def see_keys_secret(spec: RunSpec, owner: dict) -> dict:
    """The run's SEE signing keys, one per service; each pod mounts only its own and its
    sources' (:func:`see_key_env`)."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": dns_name(spec.run, "see-keys"), "namespace": spec.namespace, "ownerReferences": [owner],
                     "labels": {"app.kubernetes.io/name": "mutualrl", "app.kubernetes.io/managed-by": "mutualrl-mwra",
                                "mutualrl.io/run": spec.run}},
        "stringData": dict(spec.see_keys),
    }


def see_key_env(spec: RunSpec, policy: str, role: str) -> list[dict]:
    """A pod's signing keys: its own and those of the services it reads, each from the run's
    keys Secret, joined into MUTUALRL_SEE_KEYS by the kubelet's $(VAR) expansion; without
    per-run keys, the run key (the pod derives every key from it)."""
    if not spec.see_keys:
        return [{"name": "MUTUALRL_HMAC_KEY",
                 "valueFrom": {"secretKeyRef": {"name": spec.hmac_secret,
                                                "key": "hmac-key"}}}] if spec.hmac_secret else []
    policies = sorted({s.rsplit(".", 1)[0] for s in spec.see_keys})
    env, pairs = [], []
    for svc in dict.fromkeys([f"{policy}.{role}", *services_read(policy, role, policies)]):
        var = key_env(svc)
        env.append({"name": var, "valueFrom": {"secretKeyRef": {"name": dns_name(spec.run, "see-keys"), "key": svc}}})
        pairs.append(f"{svc}=$({var})")
    return env + [{"name": SEE_KEYS_ENV, "value": ",".join(pairs)}]


def gang_name(spec: RunSpec, policy: str, generation: int) -> str:
    """The name of a policy's gang in one plan generation."""
    return dns_name(spec.run, policy, f"g{generation}")


def members(alloc: Allocation) -> list[tuple[str, int, int, str]]:
    """(role, index, gpus, node) per pod: one per rollout replica and one per learner piece."""
    return [(p.role, p.replica, p.gpus, p.node) for p in sorted(alloc.placements,
        key=lambda p: (p.role != "rollout", p.replica))]


def role_ports(spec: RunSpec, role: str) -> list[tuple[str, int]]:
    """A role's named ports; a learner of the collective transport also hosts its weight group."""
    extra = [("weights", spec.weights_port)] if role == "learner" and spec.weights_port is not None else []
    return ROLE_PORTS[role] + extra


def _command(spec: RunSpec, policy: str, role: str) -> list[str]:
    # the learner's headless Service
    group = f"{dns_name(spec.run, policy, 'learner')}:{spec.weights_port}" if spec.weights_port is not None else None
    return ["mutualrl",
            *serve_argv(role, policy, config="/etc/mutualrl/config.yaml", namespace=spec.run,
                        redis="$(MUTUALRL_REDIS_URL)",
                        weights="/weights", out="/data", ops_port=9000,
                        grpc_port=50051 if role == "rollout" else None, weights_group=group)]


def _env(spec: RunSpec, policy: str, role: str) -> list[dict]:
    """A service's environment: the Redis URL (from a Secret when one is named), who it is, its SEE keys and
    its own Redis identity (the ACL lets it append only to its own streams)."""
    if spec.redis_url_secret:
        secret = {"secretKeyRef": {"name": spec.redis_url_secret, "key": "redis-url"}}
        url = {"name": "MUTUALRL_REDIS_URL", "valueFrom": secret}
    else:
        url = {"name": "MUTUALRL_REDIS_URL", "value": spec.redis_url or "redis://redis:6379/0"}
    identity = []
    if spec.redis_users_secret:
        identity = [{"name": "MUTUALRL_REDIS_USERNAME", "value": f"{policy}.{role}"},
                    {"name": "MUTUALRL_REDIS_PASSWORD",
                     "valueFrom": {"secretKeyRef": {"name": spec.redis_users_secret, "key": f"{policy}.{role}"}}}]
    return [url, {"name": "MUTUALRL_POLICY", "value": policy}, {"name": "MUTUALRL_ROLE", "value": role},
            *see_key_env(spec, policy, role), *identity]


SERVICE_PROBES = {"startup": "startupProbe", "readiness": "readinessProbe", "liveness": "livenessProbe"}
READ_ONLY_CONTAINER = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                       "capabilities": {"drop": ["ALL"]}}
ENGINE_HOME = "/tmp"  # the engines' caches (torch compile, triton, HF) under a writable emptyDir


def _pod_config(spec: RunSpec, policy: str) -> PodConfig:
    return spec.pods.get(policy) or PodConfig()


def _with_gpus(resources: dict, gpus: int) -> dict:
    """Requests and limits with ``gpus`` NVIDIA GPUs added (an extended resource's request equals its limit)."""
    out = {part: dict(resources.get(part, {})) for part in ("requests", "limits")}
    if gpus > 0:
        for part in out:
            out[part]["nvidia.com/gpu"] = str(gpus)
    return {part: {k: str(v) for k, v in amounts.items()} for part, amounts in out.items() if amounts}


def pod_gpus(pod: dict) -> int:
    """The GPUs a pod holds: over all its containers (an engine sidecar holds the rollout's, not the service)."""
    return sum(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
               for c in pod["spec"]["containers"])


def service_resources(spec: RunSpec, policy: str, gpus: int) -> dict:
    """The rollout or learner container's resources: the policy's ``kubernetes.resources`` when set, else its
    ``resources.cpu``/``memory`` (the memory also as the limit), plus its GPUs."""
    cfg = _pod_config(spec, policy)
    if cfg.resources:
        return _with_gpus(cfg.resources, gpus)
    res = spec.resources.get(policy, {})
    mem = str(res.get("memory", "16Gi"))
    cpu = f"{float(res.get('cpu', 4)):g}"
    return _with_gpus({"requests": {"cpu": cpu, "memory": mem}, "limits": {"memory": mem}}, gpus)


def probes(cfg: PodConfig, port: str) -> dict:
    """The startup, readiness and liveness probes of a service's ops port."""
    return {key: {"httpGet": {"path": "/healthz", "port": port}, "periodSeconds": p.period_s,
                  "failureThreshold": p.failure_threshold}
            for name, key in SERVICE_PROBES.items() for p in [getattr(cfg.probes, name)]}


def models_env(spec: RunSpec) -> list[dict]:
    """HF_HOME under the model volume, and HF_TOKEN from its Secret when one is named."""
    env = [{"name": "HF_HOME", "value": spec.models.hf_home}]
    if spec.models.hf_token_secret:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": spec.models.hf_token_secret,
                                                                       "key": "token"}}})
    return env


def volumes(spec: RunSpec, policy: str, role: str, owner: dict) -> list[dict]:
    """The pod's volumes: the experiment, the weights, its state (a PVC when the run names one), /tmp, the models."""
    claim = spec.weights_claim
    state = spec.state_claims.get(f"{policy}.{role}")
    m = spec.models
    if m.claim:
        models = {"persistentVolumeClaim": {"claimName": m.claim, "readOnly": not m.download}}
    elif m.host_path:
        models = {"hostPath": {"path": m.host_path, "type": "Directory"}}
    else:
        models = {"emptyDir": {}}
    return [
        {"name": "config", "configMap": {"name": owner["name"]}},
        {"name": "weights", **({"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}})},
        {"name": "data", **({"persistentVolumeClaim": {"claimName": state}} if state else {"emptyDir": {}})},
        {"name": "tmp", "emptyDir": {}},
        {"name": "models", **models},
    ]


def service_mounts(role: str, index: int) -> list[dict]:
    """Where a service finds its volumes; each pod's state is its own directory of the role's state volume."""
    return [{"name": "config", "mountPath": "/etc/mutualrl", "readOnly": True},
            {"name": "weights", "mountPath": "/weights"},
            {"name": "data", "mountPath": "/data", "subPath": f"{role}-{index}"},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "models", "mountPath": "/models", "readOnly": True}]


def placement(cfg: PodConfig, node: str = "") -> dict:
    """Node selection, tolerations, affinity, runtime and priority class of a policy's pods; ``node`` pins the pod
    where MWRA's own admission placed it."""
    out: dict = {}
    selector = dict(cfg.node_selector) | ({"kubernetes.io/hostname": node} if node else {})
    if selector:
        out["nodeSelector"] = selector
    if cfg.tolerations:
        out["tolerations"] = [dict(t) for t in cfg.tolerations]
    if cfg.affinity:
        out["affinity"] = dict(cfg.affinity)
    if cfg.runtime_class_name:
        out["runtimeClassName"] = cfg.runtime_class_name
    if cfg.priority_class_name:
        out["priorityClassName"] = cfg.priority_class_name
    return out


def model_download(spec: RunSpec) -> list[dict]:
    """The init container that fills the model volume, when the run names one."""
    d = spec.models.download
    if d is None:
        return []
    return [{"name": "models", "image": d.image, "command": list(d.command), "env": models_env(spec),
             "securityContext": READ_ONLY_CONTAINER,
             "volumeMounts": [{"name": "models", "mountPath": "/models"}, {"name": "tmp", "mountPath": "/tmp"}]}]


def service_container(spec: RunSpec, policy: str, role: str, index: int, gpus: int, replicas: int = 1) -> dict:
    """The rollout or learner service: ``mutualrl serve`` with its environment, ports, probes and resources; rollout
    replica ``index`` of ``replicas`` samples its share of every step (``mutualrl.runtime.shard``)."""
    shard = [{"name": REPLICA_ENV, "value": str(index)},
             {"name": REPLICAS_ENV, "value": str(replicas)}] if role == "rollout" else []
    # a learner logs its policy to the run's trackers, with their credentials from the run's Secret
    tracker = {"envFrom": [{"secretRef": {"name": spec.tracking_secret}}]} if (
        role == "learner" and spec.tracking_secret) else {}
    return {
        "name": role,
        "image": spec.image,
        "command": _command(spec, policy, role),
        "env": [*_env(spec, policy, role), *shard, *models_env(spec), {"name": "HF_HUB_OFFLINE", "value": "1"}],
        **tracker,
        "ports": [{"name": n, "containerPort": p} for n, p in role_ports(spec, role)],
        "resources": service_resources(spec, policy, gpus),
        **probes(_pod_config(spec, policy), "ops"),
        "securityContext": READ_ONLY_CONTAINER,
        "volumeMounts": service_mounts(role, index),
    }


def pod(spec: RunSpec, alloc: Allocation, role: str, index: int, gpus: int, generation: int, gang: str, backend: str,
        owner: dict, node: str = "") -> dict:
    """One service's pod, with the gang scheduler's labels, annotations or scheduler name for ``backend``."""
    cfg = _pod_config(spec, alloc.policy)
    meta_labels = labels(spec, alloc.policy, role, generation)
    annotations: dict[str, str] = {}
    engine = spec.engines.get(alloc.policy)
    sidecar = role == "rollout" and bool(engine) and _server(engine) is not None
    pod_spec: dict = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": model_download(spec),
        # the engine server is a sidecar holding the GPUs; the rollout service talks to it on localhost
        "containers": [service_container(spec, alloc.policy, role, index, 0 if sidecar else gpus,
                                         replicas=sum(1 for m in members(alloc) if m[0] == "rollout"))],
        "volumes": volumes(spec, alloc.policy, role, owner),
        "subdomain": dns_name(spec.run, alloc.policy, role),
        "hostname": dns_name(role, str(index)),
        **placement(cfg, node if backend == "mwra" else ""),  # MWRA's own admission placed it on this node
    }
    if not pod_spec["initContainers"]:
        del pod_spec["initContainers"]
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in spec.image_pull_secrets]
    if sidecar:
        pod_spec["containers"].append(engine_container(engine, gpus, cfg, spec))
        pod_spec["volumes"].append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": cfg.engine_shm_size}})
    total = len(members(alloc))
    if backend == "kueue":
        meta_labels["kueue.x-k8s.io/queue-name"] = spec.queue
        meta_labels["kueue.x-k8s.io/pod-group-name"] = gang
        annotations["kueue.x-k8s.io/pod-group-total-count"] = str(total)
    elif backend == "kai":
        meta_labels["kai.scheduler/queue"] = spec.queue
        annotations["pod-group-name"] = gang
        pod_spec["schedulerName"] = "kai-scheduler"
    elif backend == "volcano":
        annotations["scheduling.k8s.io/group-name"] = gang
        pod_spec["schedulerName"] = "volcano"
    elif backend == "native":
        pod_spec["schedulingGroup"] = {"podGroupName": gang}
    meta = {"name": dns_name(spec.run, alloc.policy, role, str(index)), "namespace": spec.namespace,
            "labels": meta_labels, "ownerReferences": [owner]}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def _server(engine: dict) -> ServerFacts | None:
    """How the policy's engine runs as a server (None: in the rollout process)."""
    return engine_facts(engine["backend"]).server if engine.get("backend") else None


def engine_argv(engine: dict) -> list[str]:
    """The engine server's arguments: the model, port 8000, tensor parallelism, the weight-reload mode, metrics."""
    server = _server(engine)
    assert server is not None, f"{engine['backend']} does not run as a server"
    return server.argv(engine.get("model", ""), int(engine.get("tp", 1)), list(engine.get("args", [])))


def engine_container(engine: dict, gpus: int, cfg: PodConfig | None = None, spec: RunSpec | None = None) -> dict:
    """vLLM or SGLang serving the policy's model on the rollout GPUs, with the weight-reload
    routes the rollout adapters call (docs/mwra.md, "Backends") and its Prometheus metrics on the
    ``engine`` port."""
    cfg = cfg or PodConfig()
    env = [{"name": "HOME", "value": ENGINE_HOME}, {"name": "XDG_CACHE_HOME", "value": f"{ENGINE_HOME}/.cache"}]
    env += models_env(spec) if spec is not None else []
    server = _server(engine)
    assert server is not None, f"{engine['backend']} does not run as a server"
    c = {"name": "engine", "image": engine.get("image") or server.image,
         **({"command": list(server.command)} if server.command else {}), "args": engine_argv(engine),
         "env": [*({"name": k, "value": v} for k, v in server.env), *env]}
    health = {"httpGet": {"path": "/health", "port": "engine"}}
    c.update({
        "ports": [{"name": "engine", "containerPort": 8000}],
        "startupProbe": {**health, "periodSeconds": 10, "failureThreshold": 120},
        "readinessProbe": {**health, "periodSeconds": 10},
        "livenessProbe": {**health, "periodSeconds": 20, "failureThreshold": 6},
        "resources": _with_gpus(cfg.engine_resources, gpus),
        "securityContext": READ_ONLY_CONTAINER,
        "volumeMounts": [{"name": "weights", "mountPath": "/weights"}, {"name": "tmp", "mountPath": "/tmp"},
                         {"name": "models", "mountPath": "/models", "readOnly": True},
                         {"name": "shm", "mountPath": "/dev/shm"}],
    })
    return c


def headless_service(spec: RunSpec, policy: str, role: str, generation: int, owner: dict) -> dict:
    """A policy role's headless Service: stable DNS names for its pods."""
    sel = {"mutualrl.io/run": spec.run, "mutualrl.io/policy": policy, "mutualrl.io/role": role}
    ports = role_ports(spec, role)
    if role == "rollout" and _server(spec.engines.get(policy, {})) is not None:
        ports = [*ports, ("engine", 8000)]  # the sidecar's own metrics, for the ServiceMonitor
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": dns_name(spec.run, policy, role), "namespace": spec.namespace,
                     "labels": labels(spec, policy, role, generation),
                     "ownerReferences": [owner]},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": sel,
                 "ports": [{"name": n, "port": p, "targetPort": n} for n, p in ports]},
    }


def group_object(spec: RunSpec, alloc: Allocation, generation: int, gang: str, backend: str,
                 owner: dict) -> dict | None:
    """The backend's grouping object, or None where the grouping lives on the pods alone."""
    total = len(members(alloc))
    gpus = sum(m[2] for m in members(alloc))
    meta = {"name": gang, "namespace": spec.namespace, "labels": labels(spec, alloc.policy, None, generation),
            "ownerReferences": [owner]}
    if backend == "kai":
        g, v = GROUP_VERSIONS["kai"]
        return {"apiVersion": f"{g}/{v}", "kind": "PodGroup", "metadata": meta,
                "spec": {"minMember": total, "queue": spec.queue}}
    if backend == "volcano":
        g, v = GROUP_VERSIONS["volcano"]
        return {"apiVersion": f"{g}/{v}", "kind": "PodGroup", "metadata": meta,
                "spec": {"minMember": total, "queue": spec.queue, "minResources": {"nvidia.com/gpu": str(gpus)}}}
    if backend == "native":
        g, v = GROUP_VERSIONS["native"]
        return {"apiVersion": f"{g}/{v}", "kind": "PodGroup", "metadata": meta,
                "spec": {"schedulingPolicy": {"gang": {"minCount": total}}}}
    return None


def gang_objects(spec: RunSpec, alloc: Allocation, generation: int, backend: str, owner: dict) -> list[dict]:
    """Everything one policy's gang needs, grouping object first (pods refer to it)."""
    if backend not in GANG_BACKENDS:
        raise ValueError(f"unknown gang backend {backend!r}; known: {', '.join(GANG_BACKENDS)}")
    gang = gang_name(spec, alloc.policy, generation)
    out = []
    group = group_object(spec, alloc, generation, gang, backend, owner)
    if group is not None:
        out.append(group)
    out += [headless_service(spec, alloc.policy, role, generation, owner) for role in ("rollout", "learner")]
    out += [pod(spec, alloc, role, i, g, generation, gang, backend, owner, node) for role, i, g, node in members(alloc)]
    return out
