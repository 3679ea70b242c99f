"""MWRA's Kubernetes backend, with the official ``kubernetes`` client only.

It reconciles like a controller: read the desired gangs (the plan), read what the cluster shows
(a watch on the run's pods, resumed from its resourceVersion and listed again on 410 Gone), act on
the difference — recreate a failed or deleted member, report a lost node so the controller
re-plans — and do it again on every poll. Whole gangs are created or deleted, never a part.

The gang backend is discovered from the served API groups (Kueue, KAI, Volcano, native
``scheduling.k8s.io``), else MWRA admits a gang itself only when it fits the free allocatable
GPUs and evicts and requeues it when it is not running within the admission timeout.
A Lease elects one active controller; Kubernetes Events record what MWRA decided.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from dataclasses import dataclass, field

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from typing_extensions import override

from mutualrl.services.mwra.backends import k8s_objects as ko
from mutualrl.services.mwra.backends.base import Backend, BackendEvent, RunSpec
from mutualrl.services.mwra.planner import Node, Plan

log = logging.getLogger("mutualrl.mwra.kubernetes")
DISCOVERY_ORDER = ("kueue", "kai", "volcano", "native")
_PLURALS = {"PodGroup": "podgroups"}  # the gang backends' custom objects


def _served(api: client.ApiClient, group: str, version: str, resource: str) -> bool:
    try:
        found = client.CustomObjectsApi(api).get_api_resources(group, version)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return any(r.name == resource for r in (found.resources or []))


def discover_gang_backend(api: client.ApiClient) -> str:
    """The first gang scheduler the API server serves, in the documented order; ``mwra`` when none."""
    probes = {
        "kueue": [("kueue.x-k8s.io", "v1beta1", "workloads")],
        "kai": [("scheduling.run.ai", "v2alpha2", "podgroups")],
        "volcano": [("scheduling.volcano.sh", "v1beta1", "podgroups")],
        "native": [("scheduling.k8s.io", "v1alpha2", "podgroups")],
    }
    for name in DISCOVERY_ORDER:
        for group, version, resource in probes[name]:
            if _served(api, group, version, resource):
                return name
    return "mwra"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class LeaderElection:
    """One active controller per namespace, through a ``coordination.k8s.io`` Lease.

    On a real API server the takeover of an expired lease is a patch carrying the lease's
    resourceVersion, so two contenders cannot both win; creation is atomic (409 for the loser).
    """

    def __init__(self, api: client.ApiClient, namespace: str, name: str = "mutualrl-mwra", identity: str | None = None,
                 duration_s: int = 15):
        self.api = client.CoordinationV1Api(api)
        self.namespace, self.name, self.duration_s = namespace, name, duration_s
        self.identity = identity or f"mwra-{uuid.uuid4().hex[:8]}"

    def try_acquire(self) -> bool:
        """Take or renew the Lease; True while this controller leads."""
        now = _now()
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                spec=client.V1LeaseSpec(holder_identity=self.identity, lease_duration_seconds=self.duration_s,
                                        acquire_time=now, renew_time=now, lease_transitions=0),
            )
            try:
                self.api.create_namespaced_lease(self.namespace, body)
                return True
            except ApiException as e2:
                if e2.status == 409:
                    return False  # another controller created it first
                raise
        spec = lease.spec
        renew = spec.renew_time or spec.acquire_time
        expired = renew is None or (now - renew).total_seconds() > (spec.lease_duration_seconds or self.duration_s)
        if spec.holder_identity == self.identity:
            self.api.patch_namespaced_lease(self.name, self.namespace, {"spec": {"renewTime": now.isoformat()}})
            return True
        if not expired:
            return False
        version = lease.metadata.resource_version
        patch = {"metadata": {"resourceVersion": version} if version else {},
                 "spec": {"holderIdentity": self.identity, "acquireTime": now.isoformat(), "renewTime": now.isoformat(),
                          "leaseTransitions": (spec.lease_transitions or 0) + 1}}
        try:
            self.api.patch_namespaced_lease(self.name, self.namespace, patch)
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True


@dataclass
class _Gang:
    spec: RunSpec
    policy: str
    generation: int
    objects: list[dict]
    created_at: float
    admitted: bool = False
    queued: bool = False  # mwra admission: waiting for free GPUs


@dataclass
class _RunState:
    spec: RunSpec
    owner: dict
    gangs: dict[str, _Gang] = field(default_factory=dict)


class KubernetesBackend(Backend):
    """Gangs as pods and headless Services, admitted by Kueue, KAI, Volcano, native gangs or MWRA itself."""
    name = "kubernetes"

    def __init__(self, api: client.ApiClient, namespace: str, gang: str = "auto", admission_timeout_s: float = 600.0,
                 watch_seconds: float = 1.0, clock=time.monotonic, static_nodes: list[Node] | None = None):
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.gang = discover_gang_backend(api) if gang == "auto" else gang
        self.admission_timeout_s = admission_timeout_s
        self.watch_seconds = watch_seconds
        self.clock = clock
        self.runs: dict[str, _RunState] = {}
        self.pods: dict[str, dict] = {}  # name -> last seen object (of our runs)
        self.resource_version: str | None = None
        self.known_nodes: set[str] | None = None
        self.events: list[BackendEvent] = []
        self.relists = 0
        self.static_nodes = static_nodes  # planned on when nodes cannot be listed (no ClusterRole)

    # ---- nodes ---------------------------------------------------------------------------------
    @override
    def nodes(self) -> list[Node]:
        if self.static_nodes is not None:
            return list(self.static_nodes)
        out = []
        for n in self.core.list_node().items:
            alloc = (n.status.allocatable or {}) if n.status else {}
            gpus = int(alloc.get("nvidia.com/gpu", "0") or 0)
            unschedulable = bool(n.spec and n.spec.unschedulable)
            conditions = (n.status.conditions or []) if n.status else []
            ready = all(c.status == "True" for c in conditions if c.type == "Ready")
            if gpus > 0 and not unschedulable and ready:
                out.append(Node(n.metadata.name, gpus))
        return sorted(out, key=lambda x: x.name)

    # ---- objects -------------------------------------------------------------------------------
    def _create(self, obj: dict) -> dict:
        kind, ns = obj["kind"], obj["metadata"].get("namespace", self.namespace)
        if kind == "Pod":
            return self.api.sanitize_for_serialization(self.core.create_namespaced_pod(ns, obj))
        if kind == "Service":
            return self.api.sanitize_for_serialization(self.core.create_namespaced_service(ns, obj))
        if kind == "ConfigMap":
            return self.api.sanitize_for_serialization(self.core.create_namespaced_config_map(ns, obj))
        if kind == "Secret":
            return self.api.sanitize_for_serialization(self.core.create_namespaced_secret(ns, obj))
        group, version = obj["apiVersion"].split("/")
        plural = _PLURALS[kind]
        return self.custom.create_namespaced_custom_object(group, version, ns, plural, obj) or obj

    def _delete(self, obj: dict) -> None:
        kind, ns, name = obj["kind"], obj["metadata"].get("namespace", self.namespace), obj["metadata"]["name"]
        try:
            if kind == "Pod":
                self.core.delete_namespaced_pod(name, ns)
            elif kind == "Service":
                self.core.delete_namespaced_service(name, ns)
            elif kind == "ConfigMap":
                self.core.delete_namespaced_config_map(name, ns)
            else:
                group, version = obj["apiVersion"].split("/")
                self.custom.delete_namespaced_custom_object(group, version, ns, _PLURALS[kind], name)
        except ApiException as e:
            if e.status != 404:
                raise

    def _owner(self, spec: RunSpec) -> dict:
        cm = ko.config_map(spec)
        try:
            created = self._create(cm)
        except ApiException as e:
            if e.status != 409:
                raise
            created = self.api.sanitize_for_serialization(self.core.read_namespaced_config_map(cm["metadata"]["name"],
                spec.namespace))
        meta = created.get("metadata", {})
        # a real API server assigns the uid; an emulator may not, and then a stable one stands in
        uid = meta.get("uid") or str(uuid.uuid5(uuid.NAMESPACE_URL, f"mutualrl:{spec.namespace}:{meta.get('name')}"))
        owner = ko.owner_reference({"metadata": {"name": meta.get("name", cm["metadata"]["name"]), "uid": uid}})
        if spec.see_keys:  # the run's signing keys, deleted with it (owner: the ConfigMap)
            try:
                self._create(ko.see_keys_secret(spec, owner))
            except ApiException as e:
                if e.status != 409:
                    raise
        return owner

    @override
    def record_event(self, spec: RunSpec, reason: str, message: str, kind: str = "Normal") -> None:
        now = _now()
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=ko.dns_name(spec.run, reason, uuid.uuid4().hex[:8]),
                                         namespace=spec.namespace),
            involved_object=client.V1ObjectReference(api_version="v1", kind="ConfigMap", name=ko.dns_name(spec.run,
                "config"), namespace=spec.namespace),
            reason=reason, message=message[:1024], type=kind, first_timestamp=now, last_timestamp=now, count=1,
            source=client.V1EventSource(component="mutualrl-mwra"), reporting_component="mutualrl-mwra",
            reporting_instance="mwra",
        )
        try:
            self.core.create_namespaced_event(spec.namespace, body)
        except ApiException as e:  # an event is a record, never a reason to fail a reconcile
            log.warning("event not recorded: %s", e.reason)

    # ---- the interface -------------------------------------------------------------------------
    @override
    def apply(self, spec: RunSpec, plan: Plan) -> None:
        state = self.runs.get(spec.run)
        if state is None:
            state = self.runs[spec.run] = _RunState(spec, self._owner(spec))
        for name in [n for n in state.gangs if n not in plan.allocations]:
            self._delete_gang(state.gangs.pop(name))
        for name, alloc in plan.allocations.items():
            old = state.gangs.get(name)
            if old is not None and old.generation == plan.generation:
                continue
            if old is not None:
                self._delete_gang(old)  # a gang moves whole: delete, then create at the new size
            gang = _Gang(spec, name, plan.generation, ko.gang_objects(spec, alloc, plan.generation, self.gang,
                state.owner), self.clock())
            state.gangs[name] = gang
            self._admit(gang)

    def _admit(self, gang: _Gang) -> None:
        if self.gang == "mwra":
            pods = [o for o in gang.objects if o["kind"] == "Pod"]
            need = sum(ko.pod_gpus(o) for o in pods)
            if need > sum(n.gpus for n in self.nodes()) - self._held(exclude=gang):
                gang.queued = True  # all or nothing: wait for room instead of starting a part
                return
        gang.queued = False
        gang.created_at = self.clock()
        for obj in gang.objects:
            try:
                self._create(obj)
            except ApiException as e:
                if e.status != 409:
                    raise
        self.record_event(gang.spec, "GangCreated", f"{gang.policy}: "
            f"{sum(1 for o in gang.objects if o['kind'] == 'Pod')} pods, plan generation {gang.generation}, gang "
                          f"backend {self.gang}")

    def _held(self, exclude: _Gang) -> int:
        """GPUs of every gang this controller has started (queued ones hold nothing)."""
        return sum(ko.pod_gpus(o)
                   for state in self.runs.values() for g in state.gangs.values() if g is not exclude and not g.queued
                   for o in g.objects if o["kind"] == "Pod")

    def _delete_gang(self, gang: _Gang) -> None:
        for obj in reversed(gang.objects):
            self._delete(obj)
            self.pods.pop(obj["metadata"]["name"], None)

    @override
    def delete(self, run: str) -> None:
        state = self.runs.pop(run, None)
        if state is None:
            return
        for gang in state.gangs.values():
            self._delete_gang(gang)
        # the ConfigMap owns everything: on a real cluster its deletion alone cleans up
        self._delete(ko.config_map(state.spec))

    # ---- watching and repairing ----------------------------------------------------------------
    def _ours(self, obj: dict) -> bool:
        # label selectors are applied on the client as well (an emulator may ignore them)
        labels = (obj.get("metadata") or {}).get("labels") or {}
        ours = labels.get("app.kubernetes.io/managed-by") == "mutualrl-mwra"
        return ours and labels.get("mutualrl.io/run") in self.runs

    def _relist(self) -> None:
        self.relists += 1
        listed = self.core.list_namespaced_pod(self.namespace,
                                               label_selector="app.kubernetes.io/managed-by=mutualrl-mwra")
        self.pods = {}
        for p in listed.items:
            obj = self.api.sanitize_for_serialization(p)
            if self._ours(obj):
                self.pods[obj["metadata"]["name"]] = obj
        rv = listed.metadata.resource_version if listed.metadata else None
        self.resource_version = rv if rv and rv.isdigit() else None

    def _watch(self) -> None:
        if self.resource_version is None:
            self._relist()
        w = watch.Watch()
        try:
            kwargs = {"label_selector": "app.kubernetes.io/managed-by=mutualrl-mwra", "timeout_seconds": max(1,
                int(self.watch_seconds)),
                      "_request_timeout": self.watch_seconds + 1, "allow_watch_bookmarks": True}
            if self.resource_version:
                kwargs["resource_version"] = self.resource_version
            for ev in w.stream(self.core.list_namespaced_pod, self.namespace, **kwargs):
                obj = self.api.sanitize_for_serialization(ev["object"]) if not isinstance(ev["object"],
                    dict) else ev["object"]
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv and str(rv).isdigit():
                    self.resource_version = str(rv)
                if ev["type"] == "BOOKMARK" or not self._ours(obj):
                    continue
                name = obj["metadata"]["name"]
                if ev["type"] == "DELETED":
                    self.pods.pop(name, None)
                else:
                    self.pods[name] = obj
        except ApiException as e:
            if e.status == 410:  # our resourceVersion is too old: list again, then watch from there
                self.resource_version = None
                self._relist()
            else:
                raise
        except Exception as e:  # noqa: BLE001 - the client-side read timeout ends a quiet watch
            if "timed out" not in str(e).lower() and "timeout" not in type(e).__name__.lower():
                raise
        finally:
            w.stop()

    @override
    def poll(self) -> list[BackendEvent]:
        self._watch()
        nodes = {n.name for n in self.nodes()}
        if self.known_nodes is not None:
            for lost in sorted(self.known_nodes - nodes):
                self.events.append(BackendEvent("node_lost", detail=lost))
        self.known_nodes = nodes
        now = self.clock()
        for state in self.runs.values():
            for gang in state.gangs.values():
                self._reconcile(state, gang, now)
        out, self.events = self.events, []
        return out

    def _reconcile(self, state, gang, now: float) -> None:
        """One gang against what the cluster runs: admit a queued gang, recreate a pod that is
        gone or finished, mark the gang admitted once every pod runs, or (MWRA gangs) evict and
        requeue one that did not start within the admission timeout."""
        if gang.queued:
            self._admit(gang)
            return
        pods = [o for o in gang.objects if o["kind"] == "Pod"]
        running = 0
        for desired in pods:
            name = desired["metadata"]["name"]
            seen = self.pods.get(name)
            phase = ((seen or {}).get("status") or {}).get("phase")
            if seen is None or phase in ("Failed", "Succeeded"):
                if seen is not None:
                    self._delete(desired)
                try:
                    self._create(desired)
                except ApiException as e:
                    if e.status != 409:
                        raise
                self.pods.pop(name, None)
                why = "deleted" if seen is None else phase.lower()
                self.events.append(BackendEvent("pod_recreated", state.spec.run, gang.policy, f"{name} {why}"))
                self.record_event(state.spec, "PodRecreated", f"{name} was {why}; recreated")
            elif phase == "Running":
                running += 1
        if not gang.admitted and running == len(pods):
            gang.admitted = True
            self.events.append(BackendEvent("gang_admitted", state.spec.run, gang.policy,
                                            seconds=now - gang.created_at))
            self.record_event(state.spec, "GangAdmitted", f"{gang.policy}: all {len(pods)} pods running after "
                              f"{now - gang.created_at:.0f}s")
        elif not gang.admitted and self.gang == "mwra" and now - gang.created_at > self.admission_timeout_s:
            self._delete_gang(gang)
            gang.queued = True
            self.events.append(BackendEvent("gang_evicted", state.spec.run, gang.policy, "admission timeout"))
            self.record_event(state.spec, "GangEvicted", f"{gang.policy}: not running after "
                              f"{self.admission_timeout_s:.0f}s; evicted and requeued", "Warning")
