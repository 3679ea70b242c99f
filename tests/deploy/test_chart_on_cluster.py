"""The chart as a cluster runs it: every rendered object created in a Kubernetes API emulator (kmock, real HTTP),
the controller started with the command and experiment file the chart gives it, and the gangs it creates checked
for every per-policy setting of the values; a deleted learner pod comes back on its state volume."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import CHART, ROOT

sys.path.insert(0, str(ROOT / "tests" / "mwra"))
from mwra_kmock import CHART_RESOURCES, Cluster  # noqa: E402
from test_chart import policy_workloads, render, values_of  # noqa: E402

NS = "ml"
PLURALS = {"ConfigMap": "configmaps", "Secret": "secrets", "Service": "services", "ServiceAccount": "serviceaccounts",
           "PersistentVolumeClaim": "persistentvolumeclaims", "Deployment": "deployments",
           "StatefulSet": "statefulsets", "Role": "roles", "RoleBinding": "rolebindings", "ClusterRole": "clusterroles",
           "ClusterRoleBinding": "clusterrolebindings", "NetworkPolicy": "networkpolicies",
           "PodDisruptionBudget": "poddisruptionbudgets", "ServiceMonitor": "servicemonitors",
           "PodMonitor": "podmonitors", "PrometheusRule": "prometheusrules"}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding"}


def gpu_values() -> dict:
    v = values_of(CHART / "ci" / "gpu-vllm-3-values.yaml")
    v["models"] = {"existingClaim": "team-models", "hfTokenSecret": "hf-token"}
    v["priorityClassName"] = "training"
    v["tracking"] = {"backends": ["jsonl", "mlflow"], "mlflow": {"trackingUri": "http://mlflow.mlops:5000"},
                     "credentialsSecret": "mlflow-credentials"}
    v["policies"][1]["engine"]["resources"] = {"requests": {"cpu": "6", "memory": "48Gi"}, "limits": {"memory": "48Gi"}}
    v["policies"][1]["probes"] = {"startup": {"periodSeconds": 15, "failureThreshold": 200}}
    return v


def create(url: str, obj: dict) -> None:
    group, _, version = obj["apiVersion"].rpartition("/")
    base = f"{url}/api/{version}" if not group else f"{url}/apis/{group}/{version}"
    path = f"{base}/{PLURALS[obj['kind']]}" if obj["kind"] in CLUSTER_SCOPED else \
        f"{base}/namespaces/{NS}/{PLURALS[obj['kind']]}"
    obj = {**obj, "metadata": {**obj["metadata"], **({} if obj["kind"] in CLUSTER_SCOPED else {"namespace": NS})}}
    req = urllib.request.Request(path, json.dumps(obj).encode(), {"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status in (200, 201), (obj["kind"], r.status)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_controller(cluster: Cluster, objs: list[dict], tmp_path: Path) -> subprocess.Popen:
    """The controller Deployment's own command and experiment file, pointed at the emulator by a kubeconfig."""
    deploy = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-controller"))
    c = deploy["spec"]["template"]["spec"]["containers"][0]
    config = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-experiment"))
    (tmp_path / "config.yaml").write_text(config["data"]["config.yaml"])
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": cluster.url}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "u", "namespace": NS}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    args = [a.replace("/etc/mutualrl/config.yaml", str(tmp_path / "config.yaml")) for a in c["args"]
            if not a.startswith(("--host", "--port"))]
    args += ["--host=127.0.0.1", f"--port={free_port()}", "--reconcile-every=0.3"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update({"KUBECONFIG": str(tmp_path / "kubeconfig"), "MUTUALRL_API_TOKEN": "token", "MUTUALRL_HMAC_KEY": "k"})
    env.pop("MUTUALRL_REDIS_URL", None)
    return subprocess.Popen([sys.executable, "-m", "mutualrl.app.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_for(pred, timeout: float = 60.0, proc: subprocess.Popen | None = None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"controller exited {proc.returncode}: {proc.stdout.read()}")
        time.sleep(0.2)
    raise AssertionError("timed out")


def pods_of(cluster: Cluster) -> dict[tuple[str, str, str], dict]:
    return {(p["metadata"]["labels"]["mutualrl.io/policy"], p["metadata"]["labels"]["mutualrl.io/role"],
             p["spec"]["hostname"]): p for p in cluster.objects("Pod")}


def test_the_installed_chart_starts_gangs_that_carry_every_policy_setting_and_keep_their_state(tmp_path):
    values = gpu_values()
    objs = render(values)
    with Cluster("mwra", extra=CHART_RESOURCES) as cluster:
        for i in range(4):
            cluster.add_node(f"gpu-{i}", 8)
        for o in objs:
            create(cluster.url, o)
        claims = {o["metadata"]["name"] for o in cluster.objects("PersistentVolumeClaim")}
        proc = start_controller(cluster, objs, tmp_path)
        try:
            names = [p["name"] for p in values["policies"]]
            pods = wait_for(lambda: (lambda ps: ps if {(k[0], k[1]) for k in ps} == {
                (n, r) for n in names for r in ("rollout", "learner")} else None)(pods_of(cluster)), proc=proc)
            for (policy, role, _), pod in pods.items():
                want = next(p for p in values["policies"] if p["name"] == policy)
                spec = pod["spec"]
                ours = spec["containers"][0]
                assert spec.get("tolerations", []) == want.get("tolerations", [])
                assert spec["priorityClassName"] == "training"
                assert all(spec["nodeSelector"][k] == v for k, v in (want.get("nodeSelector") or {}).items())
                assert spec.get("affinity") == want.get("affinity")
                assert spec.get("runtimeClassName") == want.get("runtimeClassName")
                for part in ("requests", "limits"):
                    for k, v in want["resources"][part].items() if "resources" in want else []:
                        assert ours["resources"][part][k] == v, (policy, role, part, k)
                volumes = {v["name"]: v for v in spec["volumes"]}
                assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "team-models", "readOnly": True}
                state = volumes["data"]["persistentVolumeClaim"]["claimName"]
                assert state in claims and policy in state  # the chart's PVC for this policy
                env = {e["name"]: e for e in ours["env"]}
                assert env["HF_HOME"]["value"] == "/models/hf"
                assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf-token"
                if role == "rollout":  # vLLM beside the service, holding the GPUs, its metrics on `engine`
                    engine = spec["containers"][1]
                    assert int(engine["resources"]["limits"]["nvidia.com/gpu"]) >= 1
                    assert "nvidia.com/gpu" not in ours["resources"].get("limits", {})
                    assert {"name": "shm", "mountPath": "/dev/shm"} in engine["volumeMounts"]
                    assert "livenessProbe" in engine and engine["securityContext"]["readOnlyRootFilesystem"]
                    if policy == "llama":
                        assert engine["resources"]["requests"]["cpu"] == "6"
                        assert engine["resources"]["requests"]["memory"] == "48Gi"
                        assert engine["args"][engine["args"].index("--tensor-parallel-size") + 1] == "2"
                else:
                    assert int(ours["resources"]["limits"]["nvidia.com/gpu"]) >= want["learner"]["gpus"]
                if policy == "llama":
                    assert ours["startupProbe"]["periodSeconds"] == 15
                    assert ours["startupProbe"]["failureThreshold"] == 200
            # a learner pod is deleted (a drain, an eviction): it comes back on the same state volume and directory
            key = next(k for k in pods if k[0] == "llama" and k[1] == "learner")
            before = pods[key]
            from kubernetes import client

            client.CoreV1Api(cluster.api()).delete_namespaced_pod(before["metadata"]["name"], NS)
            wait_for(lambda: not any(p["metadata"]["name"] == before["metadata"]["name"]
                                     for p in cluster.objects("Pod")) or None, 10)
            after = wait_for(lambda: pods_of(cluster).get(key), proc=proc)
            vol = lambda p: next(v for v in p["spec"]["volumes"] if v["name"] == "data")  # noqa: E731
            mount = lambda p: next(m for m in p["spec"]["containers"][0]["volumeMounts"]  # noqa: E731
                                   if m["name"] == "data")
            assert vol(after) == vol(before) and mount(after) == mount(before)
        finally:
            proc.terminate()
            proc.wait(10)


def test_static_workloads_and_mwra_gangs_are_built_from_the_same_settings():
    """One source of truth: the static StatefulSets (mwra.enabled false) and the pods MWRA builds from the rendered
    experiment file carry the same resources, placement, probes, volumes and environment for each policy role."""
    from mutualrl.config import parse_config
    from mutualrl.services.mwra.backends import k8s_objects as ko
    from mutualrl.services.mwra.backends.base import RunSpec
    from mutualrl.services.mwra.demands import demands_from_config
    from mutualrl.services.mwra.planner import Node, make_plan

    values = gpu_values()
    objs = render(values)
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-experiment"))
    cfg = parse_config(cm["data"]["config.yaml"], "rendered", check_paths=False)
    spec = RunSpec.from_config("three-families", cm["data"]["config.yaml"], cfg, {})
    plan = make_plan(demands_from_config(cfg), [Node(f"gpu-{i}", 8) for i in range(4)])
    owner = {"name": "three-families-config", "uid": "u"}
    mwra = {}
    for name, alloc in plan.allocations.items():
        for o in ko.gang_objects(spec, alloc, 1, "kueue", ko.owner_reference({"metadata": owner})):
            if o["kind"] == "Pod" and o["spec"]["hostname"].endswith("-0"):
                mwra[(name, o["metadata"]["labels"]["mutualrl.io/role"])] = o["spec"]
    static_values = copy.deepcopy(values)
    static_values["mwra"]["enabled"] = False
    static = {(s["spec"]["template"]["metadata"]["labels"]["mutualrl.io/policy"],
               s["spec"]["template"]["metadata"]["labels"]["mutualrl.io/role"]): s["spec"]["template"]["spec"]
              for s in policy_workloads(render(static_values))}
    assert set(static) == set(mwra)

    def no_gpus(res: dict) -> dict:
        return {part: {k: v for k, v in amounts.items() if k != "nvidia.com/gpu"} for part, amounts in res.items()}

    for key, a in mwra.items():
        b = static[key]
        for field in ("tolerations", "affinity", "runtimeClassName", "priorityClassName"):
            assert a.get(field) == b.get(field), (key, field)
        assert {k: v for k, v in a.get("nodeSelector", {}).items() if k != "kubernetes.io/hostname"} == \
            b.get("nodeSelector", {}), key
        for ca, cb in zip(a["containers"], b["containers"]):
            assert ca["name"] == cb["name"]
            assert no_gpus(ca["resources"]) == no_gpus(cb["resources"]), (key, ca["name"])
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert ca[probe] == cb[probe], (key, ca["name"], probe)
            assert ca["securityContext"] == cb["securityContext"], (key, ca["name"])
            mounts = lambda c: {m["name"]: (m["mountPath"], m.get("readOnly", False)) for m in c["volumeMounts"]}  # noqa: E731
            assert mounts(ca) == mounts(cb), (key, ca["name"])
            env = lambda c: {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])  # noqa: E731
                             if e["name"].startswith(("HF_", "VLLM_", "HOME", "XDG_"))}
            assert env(ca) == env(cb), (key, ca["name"])
            if ca["name"] == "engine":
                assert ca["args"] == cb["args"] and ca["image"] == cb["image"]
        va = {v["name"]: {k: x for k, x in v.items() if k != "name"} for v in a["volumes"] if v["name"] != "config"}
        vb = {v["name"]: {k: x for k, x in v.items() if k != "name"} for v in b["volumes"] if v["name"] != "config"}
        assert va == vb, key


@pytest.mark.parametrize("mutate, message", [
    (lambda v: v["policies"].append(copy.deepcopy(v["policies"][0])), "used twice"),
    (lambda v: v["weights"].update({"size": "lots"}), "size"),
    (lambda v: v["state"].update({"size": "a lot"}), "size"),
    (lambda v: v["metrics"]["serviceMonitor"].update({"interval": "fast"}), "interval"),
    (lambda v: v["policies"][0].update({"rollout": {"gpus": 1, "tensorParallel": 4}}), "tensorParallel"),
    (lambda v: v["policies"][0].update({"rollout": {"gpus": 0}}), "gpus"),
    (lambda v: v["policies"][0].update({"engine": {"backend": "hf"}, "rollout": {"gpus": 2, "tensorParallel": 2}}),
     "tensorParallel"),
    (lambda v: v["policies"][0]["resources"]["requests"].update({"cpu": "eight"}), "cpu"),
    (lambda v: v["policies"][0]["tolerations"][0].update({"effect": "NoRun"}), "effect"),
    (lambda v: v.update({"models": {"existingClaim": "m", "hostPath": "/data/models"}}), "models"),
    (lambda v: v["policies"][0]["engine"].update({"shmSize": "big"}), "shmSize"),
    (lambda v: v["metrics"]["prometheusRule"].update({"weightSyncDeadlineSeconds": 30}), "weightSyncDeadlineSeconds"),
    (lambda v: v.update({"priorityClassName": "Not_A_Name"}), "priorityClassName"),
])
def test_each_bad_value_is_refused_with_its_field_named(mutate, message):
    import helm_python

    v = values_of(CHART / "ci" / "gpu-vllm-3-values.yaml")
    v.setdefault("state", {})
    mutate(v)
    with pytest.raises(helm_python.HelmError) as e:
        helm_python.Chart.load(CHART).render(v, name="rl", namespace="ml", is_install=True)
    assert message in str(e.value), str(e.value)


def test_long_names_stay_unique_and_match_the_controllers():
    """A 40-character release and two policies with a long common prefix: every object name is distinct, a DNS
    label, and the chart's hashing is MWRA's."""
    import helm_python

    from mutualrl.services.mwra.backends.k8s_objects import dns_name

    v = values_of(CHART / "ci" / "cpu-tiny-values.yaml")
    prefix = "a-policy-name-that-goes-on-and-on-"
    v["policies"][0]["name"], v["policies"][1]["name"] = prefix + "one", prefix + "two"
    release = "r" * 40
    out = helm_python.Chart.load(CHART).render(v, name=release, namespace="ml", is_install=True)
    objs = [d for n, t in out.items() if n.endswith(".yaml") for d in yaml.safe_load_all(t) if d]
    for kind in ("StatefulSet", "Service", "PersistentVolumeClaim", "PodDisruptionBudget"):
        names = [o["metadata"]["name"] for o in objs if o["kind"] == kind]
        assert len(names) == len(set(names)), (kind, names)
        assert all(len(n) <= 63 for n in names), names
    fullname = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-experiment"))
    base = fullname["metadata"]["name"][: -len("-experiment")]
    sts = {o["metadata"]["name"] for o in policy_workloads(objs)}
    assert sts == {dns_name(base, prefix + n, r) for n in ("one", "two") for r in ("rollout", "learner")}


def test_the_controllers_role_grants_exactly_the_calls_its_backend_makes():
    """Every API call of the Kubernetes backend is allowed by the Role (or the nodes ClusterRole), and the Role
    grants nothing the backend never calls: Secrets are only created, never read."""
    import re

    src = (ROOT / "services/src/mutualrl/services/mwra/backends/kubernetes.py").read_text()
    calls = set(re.findall(r"\.(create|delete|read|list|patch|replace)_namespaced_(\w+?)\(", src))
    calls |= {("watch", "pod")} if "w.stream(self.core.list_namespaced_pod" in src else set()
    verb = {"read": "get"}
    used: dict[str, set[str]] = {}
    for v, kind in calls:
        plural = {"config_map": "configmaps", "custom_object": "podgroups", "lease": "leases"}.get(kind, kind + "s")
        used.setdefault(plural, set()).add(verb.get(v, v))
    v = values_of(CHART / "ci" / "gpu-vllm-3-values.yaml")
    v["mwra"]["gang"] = "auto"
    objs = render(v)
    role = next(o for o in objs if o["kind"] == "Role")
    granted: dict[str, set[str]] = {}
    for r in role["rules"]:
        for res in r["resources"]:
            granted.setdefault(res, set()).update(r["verbs"])
    assert granted == used, (granted, used)
    assert granted["secrets"] == {"create"}
    nodes = next(o for o in objs if o["kind"] == "ClusterRole")
    assert nodes["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]


def test_both_monitors_on_scrape_no_target_twice_and_reach_the_engines():
    objs = render(values_of(CHART / "ci" / "gpu-vllm-3-values.yaml"))
    sm = next(o for o in objs if o["kind"] == "ServiceMonitor")
    pm = next(o for o in objs if o["kind"] == "PodMonitor")
    assert {"engine", "ops"} <= {e["port"] for e in sm["spec"]["endpoints"]}
    assert {"engine", "ops"} <= {e["port"] for e in pm["spec"]["podMetricsEndpoints"]}
    # the PodMonitor takes only MWRA's pods; the ServiceMonitor only the chart's Services, which select no such pod
    assert pm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/managed-by"] == "mutualrl-mwra"
    services = [o for o in objs if o["kind"] == "Service"
                and all(o["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())]
    assert services
    for svc in services:
        assert svc["spec"]["selector"].get("app.kubernetes.io/managed-by") != "mutualrl-mwra"
    static_values = values_of(CHART / "ci" / "gpu-vllm-3-values.yaml")
    static_values["mwra"]["enabled"] = False
    rollout_services = [o for o in render(static_values) if o["kind"] == "Service"
                        and o["metadata"]["labels"].get("mutualrl.io/role") == "rollout"]
    assert all({"name": "engine", "port": 8000, "targetPort": "engine"} in s["spec"]["ports"]
               for s in rollout_services)


def test_rollout_replicas_each_sample_their_share_on_their_own_state():
    v = values_of(CHART / "ci" / "cpu-tiny-values.yaml")
    v["policies"][0]["rollout"]["replicas"] = 3
    sts = next(o for o in policy_workloads(render(v)) if o["metadata"]["labels"]["mutualrl.io/role"] == "rollout"
               and o["metadata"]["labels"]["mutualrl.io/policy"] == v["policies"][0]["name"])
    assert sts["spec"]["replicas"] == 3
    c = sts["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    assert env["MUTUALRL_POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['apps.kubernetes.io/pod-index']"
    assert env["MUTUALRL_ROLLOUT_REPLICA"]["value"] == "$(MUTUALRL_POD_INDEX)"
    assert env["MUTUALRL_ROLLOUT_REPLICAS"]["value"] == "3"
    data = next(m for m in c["volumeMounts"] if m["name"] == "data")
    assert data["subPathExpr"] == "rollout-$(MUTUALRL_POD_INDEX)"
