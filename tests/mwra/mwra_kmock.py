"""A Kubernetes API emulator (kmock) on a loopback port, driven by the official client.

kmock serves create/get/list/watch/patch/delete over real HTTP, but it ignores label selectors
(the backend also filters on the client, which is what these tests rely on), assigns no uid or
resourceVersion, does not garbage-collect owned objects and has no scheduler: tests move pods to
Running or Failed by patching them, as a kubelet would.
"""

from __future__ import annotations

import asyncio
import threading

from kmock import KubernetesEmulator, ResourceInfo, Server, resource
from kubernetes import client

CORE = {
    ("", "v1", "pods"): "Pod", ("", "v1", "services"): "Service", ("", "v1", "configmaps"): "ConfigMap",
    ("", "v1", "nodes"): "Node",
    ("", "v1", "events"): "Event", ("coordination.k8s.io", "v1", "leases"): "Lease",
}
GANG_GROUPS = {
    "kueue": [("kueue.x-k8s.io", "v1beta1", "workloads", "Workload")],
    "kai": [("scheduling.run.ai", "v2alpha2", "podgroups", "PodGroup")],
    "volcano": [("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup")],
    "native": [("scheduling.k8s.io", "v1alpha2", "podgroups", "PodGroup")],
    "native-1.35": [("scheduling.k8s.io", "v1alpha1", "workloads", "Workload")],
    "mwra": [],
}


# what a Helm install creates besides the controller's objects (the chart test feeds them all in)
CHART_RESOURCES = [
    ("", "v1", "secrets", "Secret", True), ("", "v1", "serviceaccounts", "ServiceAccount", True),
    ("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True),
    ("apps", "v1", "deployments", "Deployment", True), ("apps", "v1", "statefulsets", "StatefulSet", True),
    ("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    ("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    ("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    ("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True),
    ("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
    ("monitoring.coreos.com", "v1", "servicemonitors", "ServiceMonitor", True),
    ("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor", True),
    ("monitoring.coreos.com", "v1", "prometheusrules", "PrometheusRule", True),
]


class Cluster:
    def __init__(self, served: str = "mwra", extra: list[tuple[str, str, str, str, bool]] = ()):
        self.served = served
        self.extra = list(extra)
        self._ready = threading.Event()
        self._stop = False
        self.url = ""
        self.emulator: KubernetesEmulator | None = None
        core = {plural: k for (_, _, plural), k in CORE.items()}
        self._kinds = core | {plural: k for _, _, plural, k in GANG_GROUPS[served]} | {
            plural: k for _, _, plural, k, _ in self.extra}
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        async with KubernetesEmulator() as k, Server(k) as srv:
            for (g, v, plural), kind in CORE.items():
                k.resources[resource(g, v, plural)] = ResourceInfo(kind=kind, namespaced=plural != "nodes")
            for g, v, plural, kind in GANG_GROUPS[self.served]:
                k.resources[resource(g, v, plural)] = ResourceInfo(kind=kind, namespaced=True)
            for g, v, plural, kind, namespaced in self.extra:
                k.resources[resource(g, v, plural)] = ResourceInfo(kind=kind, namespaced=namespaced)
            self.emulator, self.url = k, str(srv.url).rstrip("/")
            self._ready.set()
            while not self._stop:
                await asyncio.sleep(0.02)

    def __enter__(self) -> "Cluster":
        self._thread.start()
        assert self._ready.wait(10), "kmock did not start"
        return self

    def __exit__(self, *exc) -> None:
        self._stop = True
        self._thread.join(5)

    def api(self) -> client.ApiClient:
        cfg = client.Configuration()
        cfg.host = self.url
        return client.ApiClient(cfg)

    # what a kubelet / node controller would do
    def add_node(self, name: str, gpus: int) -> None:
        client.CoreV1Api(self.api()).create_node({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "512Gi"},
                       "conditions": [{"type": "Ready", "status": "True"}]},
        })

    def remove_node(self, name: str) -> None:
        client.CoreV1Api(self.api()).delete_node(name)

    def set_phase(self, namespace: str, pod: str, phase: str) -> None:
        client.CoreV1Api(self.api()).patch_namespaced_pod(pod, namespace, {"status": {"phase": phase}})

    def objects(self, kind: str | None = None) -> list[dict]:
        assert self.emulator is not None
        out = []
        for (res, ns, name), obj in list(self.emulator.objects.items()):
            if obj.deleted:
                continue
            raw = dict(obj.raw)
            raw.setdefault("kind", self._kinds.get(res.plural, res.plural))
            if kind is None or raw.get("kind") == kind:
                out.append(raw)
        return out
