"""MWRA's Kubernetes backend over real HTTP against kmock, with the official client."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
from mwra_kmock import Cluster

from mutualrl.see.identity import derive_key, parse_keys
from mutualrl.services.mwra.backends.base import RunSpec
from mutualrl.services.mwra.backends.kubernetes import KubernetesBackend, LeaderElection, discover_gang_backend
from mutualrl.services.mwra.controller import Controller
from mutualrl.services.mwra.planner import Node, PolicyDemand, make_plan

NS = "ml"
CRD_SCHEMAS = json.loads((Path(__file__).parent / "crds" / "podgroup-schemas.json").read_text())
K8S_VERSIONS = ["1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0"]
DEMANDS = [PolicyDemand("small", 10.0, 0.5), PolicyDemand("big", 40.0, 0.6, rollout_tp=2)]


KEYS = {f"{p}.{r}": derive_key("run-key", f"{p}.{r}").decode() for p in ("small", "big") for r in ("rollout",
    "learner")}


def spec(run="exp-1") -> RunSpec:
    return RunSpec(run, "name: "
                   "x\n", NS, "registry.example/mutualrl:0.1.0-cuda", "team-a", redis_url_secret="rl-redis",
                   weights_claim="weights",
                   hmac_secret="mutualrl-hmac", see_keys=KEYS)


def strip_status(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k != "status"}


@pytest.mark.parametrize("served", ["kueue", "kai", "volcano", "native", "mwra"])
def test_each_gang_backend_creates_valid_objects(served):
    with Cluster(served) as cluster:
        for i in range(2):
            cluster.add_node(f"gpu-{i}", 8)
        api = cluster.api()
        assert discover_gang_backend(api) == served
        backend = KubernetesBackend(api, NS)
        plan = make_plan(DEMANDS, backend.nodes())
        backend.apply(spec(), plan)
        created = [o for o in cluster.objects() if o.get("kind") not in ("Node", "Event")]
        pods = [o for o in created if o["kind"] == "Pod"]
        assert len(pods) == sum(len(a.placements) for a in plan.allocations.values())
        gpus = sum(int(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) for p in pods)
        assert gpus == plan.allocated_gpus
        for p in pods:
            labels = p["metadata"]["labels"]
            assert {"mutualrl.io/run", "mutualrl.io/policy", "mutualrl.io/role",
                    "mutualrl.io/plan-generation"} <= set(labels)
            assert p["metadata"]["ownerReferences"][0]["kind"] == "ConfigMap"
        services = {o["metadata"]["name"] for o in created if o["kind"] == "Service"}
        assert services == {f"exp-1-{p}-{r}" for p in ("small", "big") for r in ("rollout", "learner")}
        for obj in created:
            key = f"{obj['apiVersion']}/{obj['kind']}"
            if key in CRD_SCHEMAS:
                jsonschema.validate(obj, CRD_SCHEMAS[key])
            elif obj["kind"] == "Workload" and served == "kueue":
                raise AssertionError("MWRA creates no Kueue Workload: Kueue makes it from the pod group")
            else:
                # spec.schedulingGroup (native gangs) exists from Kubernetes 1.36
                versions = ["1.36.0", "1.37.0"] if served == "native" and obj["kind"] == "Pod" else K8S_VERSIONS
                for v in versions:
                    kubernetes_validate.validate(strip_status(obj), v, strict=True)
        group_kinds = {o["kind"] for o in created} - {"Pod", "Service", "ConfigMap", "Secret"}
        expected = {"kueue": set(), "kai": {"PodGroup"}, "volcano": {"PodGroup"}, "native": {"PodGroup"}, "mwra": set()}
        assert group_kinds == expected[served]
        if served == "kueue":
            assert all(p["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a" for p in pods)
            assert all(p["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] for p in pods)


def test_each_pod_holds_its_own_signing_key_and_only_its_sources():
    """The run's keys live in one Secret owned by the run; a pod's MUTUALRL_SEE_KEYS (expanded as
    the kubelet expands $(VAR)) holds its own key and its sources' — never the run key."""
    import re

    with Cluster("kueue") as cluster:
        for i in range(2):
            cluster.add_node(f"gpu-{i}", 8)
        backend = KubernetesBackend(cluster.api(), NS)
        backend.apply(spec(), make_plan(DEMANDS, backend.nodes()))
        secret = next(o for o in cluster.objects() if o.get("kind") == "Secret")
        assert secret["metadata"]["ownerReferences"][0]["kind"] == "ConfigMap"
        stored = secret.get("stringData") or {}
        if not stored:  # an API server turns stringData into base64 data
            import base64
            stored = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
        assert stored == KEYS
        for p in (o for o in cluster.objects() if o.get("kind") == "Pod"):
            labels, env = p["metadata"]["labels"], p["spec"]["containers"][0]["env"]
            policy, role = labels["mutualrl.io/policy"], labels["mutualrl.io/role"]
            assert "MUTUALRL_HMAC_KEY" not in {e["name"] for e in env}
            resolved: dict[str, str] = {}
            for e in env:
                if "valueFrom" in e and e["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]:
                    resolved[e["name"]] = stored[e["valueFrom"]["secretKeyRef"]["key"]]
                elif "value" in e:
                    resolved[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: resolved.get(m.group(1), m.group(0)),
                                                 e["value"])
            keys = parse_keys(resolved["MUTUALRL_SEE_KEYS"])
            expected = {f"{policy}.rollout", f"{policy}.learner"} if role == "rollout" else {f"{policy}.learner",
                "small.rollout", "big.rollout"}
            assert set(keys) == expected and all(keys[s] == KEYS[s].encode() for s in keys)


def test_a_deleted_or_failed_pod_is_recreated():
    with Cluster("mwra") as cluster:
        cluster.add_node("gpu-0", 8)
        backend = KubernetesBackend(cluster.api(), NS, watch_seconds=0.5)
        backend.apply(spec(), make_plan(DEMANDS, backend.nodes()))
        backend.poll()
        pods = sorted(o["metadata"]["name"] for o in cluster.objects("Pod"))
        from kubernetes import client

        client.CoreV1Api(cluster.api()).delete_namespaced_pod(pods[0], NS)
        cluster.set_phase(NS, pods[1], "Failed")
        events = backend.poll()
        recreated = sorted(e.detail.split()[0] for e in events if e.kind == "pod_recreated")
        assert recreated == sorted(pods[:2])
        assert sorted(o["metadata"]["name"] for o in cluster.objects("Pod")) == pods
        reasons = {o.get("reason") for o in cluster.objects("Event")}
        assert {"GangCreated", "PodRecreated"} <= reasons


def test_all_pods_running_admits_the_gang_and_records_the_wait():
    with Cluster("volcano") as cluster:
        cluster.add_node("gpu-0", 8)
        backend = KubernetesBackend(cluster.api(), NS, watch_seconds=0.5)
        backend.apply(spec(), make_plan(DEMANDS, backend.nodes()))
        for p in cluster.objects("Pod"):
            cluster.set_phase(NS, p["metadata"]["name"], "Running")
        admitted = [e for e in backend.poll() if e.kind == "gang_admitted"]
        assert sorted(e.policy for e in admitted) == ["big", "small"]


def test_mwra_admission_waits_for_room_and_evicts_after_the_timeout():
    clock = [0.0]
    with Cluster("mwra") as cluster:
        cluster.add_node("gpu-0", 8)
        backend = KubernetesBackend(cluster.api(), NS, watch_seconds=0.5, admission_timeout_s=30,
                                    clock=lambda: clock[0])
        backend.apply(spec("first"), make_plan(DEMANDS, backend.nodes()))  # takes all 8 GPUs
        backend.apply(spec("second"), make_plan([PolicyDemand("late", 1.0)], backend.nodes()))
        # no partial start
        assert not [p for p in cluster.objects("Pod") if p["metadata"]["labels"]["mutualrl.io/run"] == "second"]
        clock[0] = 31.0
        events = backend.poll()
        assert {e.run for e in events if e.kind == "gang_evicted"} == {"first"}  # never ran: evicted, requeued
        assert not [p for p in cluster.objects("Pod") if p["metadata"]["labels"]["mutualrl.io/run"] == "first"]


def test_a_lost_node_triggers_a_replan_on_fewer_gpus():
    with Cluster("mwra") as cluster:
        cluster.add_node("gpu-0", 8)
        cluster.add_node("gpu-1", 8)
        backend = KubernetesBackend(cluster.api(), NS, watch_seconds=0.5)
        ctl = Controller(backend)
        from mutualrl.config import parse_config

        cfg = parse_config((Path(__file__).parents[2] / "examples" / "mwra" / "two-policies-gpu.yaml").read_text(),
                           check_paths=False)
        exp = ctl.submit(cfg, "name: x\n")
        used = {p.node for a in exp.plan.allocations.values() for p in a.placements}
        ctl.tick()
        cluster.remove_node(sorted(used)[0])
        events = ctl.tick()
        assert [e.kind for e in events].count("node_lost") == 1
        assert exp.plan.generation == 1 and exp.history[-1]["reason"] == "node_lost"
        assert {p.node for a in exp.plan.allocations.values() for p in a.placements} <= {"gpu-0",
            "gpu-1"} - {sorted(used)[0]}
        pods = cluster.objects("Pod")
        assert pods and all(p["metadata"]["labels"]["mutualrl.io/plan-generation"] == "1" for p in pods)


def test_two_controllers_one_acts():
    with Cluster("mwra") as cluster:
        cluster.add_node("gpu-0", 8)
        a = Controller(KubernetesBackend(cluster.api(), NS, watch_seconds=0.3),
                       leader=LeaderElection(cluster.api(), NS, identity="a"))
        b = Controller(KubernetesBackend(cluster.api(), NS, watch_seconds=0.3),
                       leader=LeaderElection(cluster.api(), NS, identity="b"))
        a.tick()
        b.tick()
        assert a.leading and not b.leading
        assert a.is_leader() and not b.is_leader()  # renewals keep it


def test_a_cluster_serving_only_the_1_35_workload_api_falls_back_to_mwra_admission():
    with Cluster("native-1.35") as cluster:
        assert discover_gang_backend(cluster.api()) == "mwra"


def test_an_external_engine_runs_as_a_sidecar_holding_the_rollout_gpus():
    with Cluster("volcano") as cluster:
        cluster.add_node("gpu-0", 8)
        backend = KubernetesBackend(cluster.api(), NS)
        s = RunSpec("exp-1", "name: "
                    "x\n", NS, "img",
                    engines={"big": {"backend": "vllm", "model": "/models/big", "tp": 2,
                                                  "args": ["--max-model-len", "4096"]}})
        backend.apply(s, make_plan(DEMANDS, backend.nodes()))
        rollout = next(p for p in cluster.objects("Pod")
                       if p["metadata"]["labels"]["mutualrl.io/policy"] == "big"
                       and p["metadata"]["labels"]["mutualrl.io/role"] == "rollout")
        ours, engine = rollout["spec"]["containers"]
        assert "nvidia.com/gpu" not in ours["resources"]["limits"]
        assert engine["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert engine["args"][:6] == ["--model", "/models/big", "--port", "8000", "--tensor-parallel-size",
                                      "2"] and "--max-model-len" in engine["args"]
        for v in K8S_VERSIONS:
            kubernetes_validate.validate(strip_status(rollout), v, strict=True)


def test_the_controller_derives_a_runs_keys_from_the_run_key_it_holds(monkeypatch):
    from mutualrl.config import load_config
    from mutualrl.services.mwra.controller import run_see_keys

    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / "demo.yaml")
    cfg = cfg.model_copy(update={"broker": cfg.broker.model_copy(update={"hmac_key_env": "MUTUALRL_HMAC_KEY"})})
    monkeypatch.delenv("MUTUALRL_HMAC_KEY", raising=False)
    assert run_see_keys(cfg) == {}  # without the key, pods get the run key's Secret and derive their own
    monkeypatch.setenv("MUTUALRL_HMAC_KEY", "run-key")
    keys = run_see_keys(cfg)
    assert set(keys) == {f"{p.name}.{r}" for p in cfg.policies for r in ("rollout", "learner")}
    assert keys[f"{cfg.policies[0].name}.learner"] == derive_key("run-key", f"{cfg.policies[0].name}.learner").decode()


def test_the_collective_transport_gives_each_learner_a_weights_port_its_rollout_pods_join():
    import dataclasses

    from mutualrl.services.mwra.backends.k8s_objects import config_map, gang_objects, owner_reference

    s = dataclasses.replace(spec(), weights_port=29600)
    plan = make_plan(DEMANDS, [Node("gpu-0", 8), Node("gpu-1", 8)])
    cm = config_map(s)
    # the API server assigns it
    owner = owner_reference({**cm, "metadata": {**cm["metadata"], "uid": "0b5c1f3e-1111-4d2e-9f00-000000000001"}})
    for name, alloc in plan.allocations.items():
        objs = gang_objects(s, alloc, 1, "mwra", owner)
        svc = next(o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == f"exp-1-{name}-learner")
        assert {"name": "weights", "port": 29600, "targetPort": "weights"} in svc["spec"]["ports"]
        for p in (o for o in objs if o["kind"] == "Pod"):
            c = p["spec"]["containers"][0]
            args = c["command"] + c.get("args", [])
            assert args[args.index("--weights-group") + 1] == f"exp-1-{name}-learner:29600"
            is_learner = p["metadata"]["labels"]["mutualrl.io/role"] == "learner"
            assert ({"name": "weights", "containerPort": 29600} in c["ports"]) == is_learner
        for o in objs:
            if o["kind"] in ("Pod", "Service"):
                kubernetes_validate.validate(o, K8S_VERSIONS[-1], strict=True)
