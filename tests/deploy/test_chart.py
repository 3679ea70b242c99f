"""The Helm chart: strict lint, render of every values file, every object against Kubernetes'
schemas (1.31-1.35) or its CRD's, the experiment it renders against mutualrl's own schema, the
commands against `mutualrl up`'s, and a broken values file failing with the field named."""

from __future__ import annotations

import copy

import helm_python
import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.prometheus_operator import v1 as prom
from conftest import CHART

from mutualrl.config import parse_config
from mutualrl.runtime.serve_args import serve_argv

VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
K8S_VERSIONS = ["1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0"]
CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor"): prom.ServiceMonitor,
        ("monitoring.coreos.com/v1", "PodMonitor"): prom.PodMonitor,
        ("monitoring.coreos.com/v1", "PrometheusRule"): prom.PrometheusRule}


def render(values: dict) -> list[dict]:
    chart = helm_python.Chart.load(CHART)
    out = chart.render(values, name="rl", namespace="ml", is_install=True)
    return [d for name, text in sorted(out.items()) if name.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def values_of(path) -> dict:
    return yaml.safe_load(path.read_text())


def policy_workloads(objs: list[dict]) -> list[dict]:
    """The static workloads of the policies (StatefulSets labelled with a policy; not Redis's)."""
    return [o for o in objs if o["kind"] == "StatefulSet" and "mutualrl.io/policy" in o["metadata"]["labels"]]


def test_three_values_files_exist():
    assert {p.name for p in VALUES} >= {"cpu-tiny-values.yaml", "gpu-vllm-3-values.yaml",
                                        "kueue-external-redis-values.yaml"}


@pytest.mark.parametrize("path", [None, *VALUES], ids=lambda p: "defaults" if p is None else p.name)
def test_lint_strict(path):
    report = helm_python.lint(CHART, values_of(path) if path else None, strict=True, kube_version="v1.33.0")
    assert not report["errors"] and not report["messages"], report


def _unknown_keys(data, dumped, where=""):
    """Keys of the input that the CRD model dropped (pydantic ignores what it does not know)."""
    out = []
    if isinstance(data, dict) and isinstance(dumped, dict):
        for k, v in data.items():
            if k not in dumped:
                out.append(f"{where}.{k}")
            else:
                out += _unknown_keys(v, dumped[k], f"{where}.{k}")
    elif isinstance(data, list) and isinstance(dumped, list):
        for i, (a, b) in enumerate(zip(data, dumped)):
            out += _unknown_keys(a, b, f"{where}[{i}]")
    return out


@pytest.mark.parametrize("path", VALUES, ids=lambda p: p.name)
def test_every_rendered_object_is_valid(path):
    objs = render(values_of(path))
    assert objs
    for obj in objs:
        key = (obj["apiVersion"], obj["kind"])
        if key in CRDS:
            model = CRDS[key].model_validate(obj)
            dumped = model.model_dump(by_alias=True, exclude_none=True, mode="json")
            assert not _unknown_keys(obj, dumped), (key, _unknown_keys(obj, dumped))
            continue
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def test_objects_per_values_file():
    kinds = {p.name: sorted({o["kind"] for o in render(values_of(p))}) for p in VALUES}
    assert "StatefulSet" in kinds["cpu-tiny-values.yaml"] and "Role" not in kinds["cpu-tiny-values.yaml"]
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ClusterRole",
            "StatefulSet"} <= set(kinds["gpu-vllm-3-values.yaml"])
    kueue = kinds["kueue-external-redis-values.yaml"]
    assert "StatefulSet" not in kueue and "ClusterRole" not in kueue and "NetworkPolicy" not in kueue


@pytest.mark.parametrize("path", VALUES, ids=lambda p: p.name)
def test_rendered_experiment_passes_mutualrls_schema(path):
    cm = next(o for o in render(values_of(path))
              if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-experiment"))
    cfg = parse_config(cm["data"]["config.yaml"], "rendered", check_paths=False)
    assert [p.name for p in cfg.policies] == [p["name"] for p in values_of(path)["policies"]]
    assert cfg.broker.backend == "redis" and cfg.broker.hmac_key_env == "MUTUALRL_HMAC_KEY"


def test_static_workloads_run_the_command_up_runs():
    objs = render(values_of(CHART / "ci" / "cpu-tiny-values.yaml"))
    deployments = policy_workloads(objs)
    assert len(deployments) == 4
    for d in deployments:
        labels = d["spec"]["template"]["metadata"]["labels"]
        c = d["spec"]["template"]["spec"]["containers"][0]
        expected = serve_argv(labels["mutualrl.io/role"], labels["mutualrl.io/policy"],
                              config="/etc/mutualrl/config.yaml", namespace="mutualrl:rl",
                              redis="$(MUTUALRL_REDIS_URL)", weights="/weights", out="/data", ops_port=9000,
                              grpc_port=50051 if labels["mutualrl.io/role"] == "rollout" else None)
        assert c["command"] == ["mutualrl"] and c["args"] == expected


def test_the_collective_transport_points_every_policy_at_its_learners_weight_group():
    values = values_of(CHART / "ci" / "cpu-tiny-values.yaml")
    values["experiment"]["weights"] = {"transport": "collective", "port": 29650}
    objs = render(values)
    for d in policy_workloads(objs):
        labels = d["spec"]["template"]["metadata"]["labels"]
        role, policy = labels["mutualrl.io/role"], labels["mutualrl.io/policy"]
        learner = next(o["metadata"]["name"] for o in objs if o["kind"] == "Service"
                       and o["metadata"]["labels"].get("mutualrl.io/policy") == policy
                       and o["metadata"]["labels"].get("mutualrl.io/role") == "learner")
        c = d["spec"]["template"]["spec"]["containers"][0]
        assert c["args"] == serve_argv(role, policy, config="/etc/mutualrl/config.yaml", namespace="mutualrl:rl",
                                       redis="$(MUTUALRL_REDIS_URL)",
                                       weights="/weights", out="/data", ops_port=9000,
                                       grpc_port=50051 if role == "rollout" else None,
                                       weights_group=f"{learner}:29650")
        assert ({"name": "weights", "containerPort": 29650} in c["ports"]) == (role == "learner")
    learner_services = [o for o in objs
                        if o["kind"] == "Service" and o["metadata"]["labels"].get("mutualrl.io/role") == "learner"]
    for svc in learner_services:
        assert {"name": "weights", "port": 29650, "targetPort": "weights"} in svc["spec"]["ports"]
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-experiment"))
    assert parse_config(cm["data"]["config.yaml"], "rendered", check_paths=False).weights.transport == "collective"
    for o in objs:  # every object is still valid Kubernetes
        if (o["apiVersion"], o["kind"]) not in CRDS:
            kubernetes_validate.validate(o, K8S_VERSIONS[-1], strict=True)


def test_bundled_redis_gives_every_pod_its_own_acl_identity(tmp_path):
    """The Redis pod's init container writes the ACL file with `mutualrl redis acl` from the users
    Secret; every policy pod runs as `<policy>.<role>`, the controller as `mwra.observer`. The
    init container's command, run here with its environment, writes a file a real Redis enforces."""
    import base64
    import os
    import subprocess
    import sys

    import redis

    from mutualrl.see.server import RedisServer

    objs = render(values_of(CHART / "ci" / "cpu-tiny-values.yaml"))
    users = next(o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-redis-users"))
    passwords = {k: base64.b64decode(v).decode() for k, v in users["data"].items()}
    policies = [p["name"] for p in values_of(CHART / "ci" / "cpu-tiny-values.yaml")["policies"]]
    assert set(passwords) == {"admin", "mwra.observer", *(f"{p}.{r}" for p in policies for r in ("rollout", "learner"))}
    redis_pod = next(o for o in objs if o["kind"] == "StatefulSet"
                     and o["metadata"]["name"].endswith("-redis"))["spec"]["template"]["spec"]
    init = redis_pod["initContainers"][0]
    assert "--aclfile" in redis_pod["containers"][0]["args"]
    for d in (o for o in objs if o["kind"] == "Deployment" or o in policy_workloads(objs)):
        env = {e["name"]: e for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
        labels = d["spec"]["template"]["metadata"]["labels"]
        who = "mwra.observer"
        if "mutualrl.io/policy" in labels:
            who = f"{labels['mutualrl.io/policy']}.{labels['mutualrl.io/role']}"
        assert env["MUTUALRL_REDIS_USERNAME"]["value"] == who
        assert env["MUTUALRL_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == who
    key_of = {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in init["env"]}
    run_env = {**os.environ, **{name: passwords[key] for name, key in key_of.items()}}
    args = [a if not a.startswith("--out=") else f"--out={tmp_path / 'users.acl'}" for a in init["args"]]
    p = subprocess.run([sys.executable, "-m", "mutualrl.app.cli", *args], capture_output=True, text=True, env=run_env)
    assert p.returncode == 0, p.stderr
    with RedisServer(password=passwords["admin"], aclfile=str(tmp_path / "users.acl")) as srv:
        a, b = policies[0], policies[1]
        me = redis.Redis(port=srv.port, username=f"{a}.rollout", password=passwords[f"{a}.rollout"])
        me.xadd(f"mutualrl:any-run:rollout:{a}", {"d": b"x"})
        with pytest.raises(redis.exceptions.NoPermissionError):
            me.xadd(f"mutualrl:any-run:rollout:{b}", {"d": b"x"})
        observer = redis.Redis(port=srv.port, username="mwra.observer", password=passwords["mwra.observer"])
        assert observer.xlen(f"mutualrl:any-run:rollout:{a}") == 1
        with pytest.raises(redis.exceptions.NoPermissionError):
            observer.xadd(f"mutualrl:any-run:heartbeat:{a}.learner", {"d": b"x"})


def test_static_pods_hold_their_own_signing_key_and_only_their_sources(tmp_path):
    """Each policy pod's MUTUALRL_SEE_KEYS, expanded from the keys Secret as the kubelet expands
    $(VAR): its own key and its sources' (a rollout its learner's, a learner every rollout
    service's) — never the run key — and what one pod signs, the pods that read it verify."""
    import base64
    import re

    from mutualrl.see.codec import CodecError, EnvelopeCodec
    from mutualrl.see.identity import Keyring, parse_keys
    from mutualrl.v1 import experience_pb2 as pb

    objs = render(values_of(CHART / "ci" / "cpu-tiny-values.yaml"))
    secret = next(o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-see-keys"))
    values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    policies = [p["name"] for p in values_of(CHART / "ci" / "cpu-tiny-values.yaml")["policies"]]
    assert set(values) == {f"{p}.{r}" for p in policies for r in ("rollout",
        "learner")} and len(set(values.values())) == len(values)
    rings = {}
    for d in policy_workloads(objs):
        labels = d["spec"]["template"]["metadata"]["labels"]
        policy, role = labels["mutualrl.io/policy"], labels["mutualrl.io/role"]
        env = d["spec"]["template"]["spec"]["containers"][0]["env"]
        assert "MUTUALRL_HMAC_KEY" not in {e["name"] for e in env}
        resolved: dict[str, str] = {}
        for e in env:  # the kubelet's expansion: secretKeyRef values, then $(VAR) in later values
            ref = e.get("valueFrom", {}).get("secretKeyRef", {})
            if ref.get("name") == secret["metadata"]["name"]:
                resolved[e["name"]] = values[e["valueFrom"]["secretKeyRef"]["key"]]
            elif "value" in e:
                resolved[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: resolved.get(m.group(1), m.group(0)), e["value"])
        keys = parse_keys(resolved["MUTUALRL_SEE_KEYS"])
        expected = {f"{policy}.{role}", f"{policy}.learner"} if role == "rollout" else {f"{policy}.learner",
            *(f"{q}.rollout" for q in policies)}
        assert set(keys) == expected and all(keys[s] == values[s].encode() for s in keys)
        rings[f"{policy}.{role}"] = EnvelopeCodec(Keyring(keys))
    a, b = policies[0], policies[1]
    _, data = rings[f"{a}.rollout"].wrap_encoded(pb.Rollout(prompt_id="p"), a)
    assert rings[f"{b}.learner"].decode(data).producer == a
    with pytest.raises(CodecError, match="no key"):
        rings[f"{b}.rollout"].decode(data)


def test_security_and_probes():
    for path in VALUES:
        for o in render(values_of(path)):
            if o["kind"] not in ("Deployment", "StatefulSet"):
                continue
            pod = o["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True
            ours = [c for c in pod["containers"] if c["name"] != "engine"]
            for c in ours:
                assert c["securityContext"]["allowPrivilegeEscalation"] is False
                assert c["securityContext"]["readOnlyRootFilesystem"] is True
                assert "readinessProbe" in c and "livenessProbe" in c


def test_controller_role_holds_only_the_chosen_gang_backends_objects():
    vals = values_of(CHART / "ci" / "gpu-vllm-3-values.yaml")
    for gang, group in (("kai", "scheduling.run.ai"), ("volcano", "scheduling.volcano.sh"),
                        ("native", "scheduling.k8s.io"), ("kueue", None), ("mwra", None)):
        v = copy.deepcopy(vals)
        v["mwra"]["gang"] = gang
        role = next(o for o in render(v) if o["kind"] == "Role")
        groups = {g for r in role["rules"] for g in r["apiGroups"]}
        assert groups - {"", "events.k8s.io", "coordination.k8s.io"} == ({group} if group else set())
        assert not any("*" in r["verbs"] or "*" in r["resources"] for r in role["rules"])


@pytest.mark.parametrize("mutate, field", [
    (lambda v: v["policies"][0].update({"enigne": {"backend": "hf"}}), "enigne"),
    (lambda v: v["policies"][0]["rollout"].update({"gpus": "two"}), "gpus"),
    (lambda v: v["mwra"].update({"gang": "slurm"}), "gang"),
    (lambda v: v.update({"replicas": 3}), "replicas"),
])
def test_a_values_file_that_breaks_the_schema_fails_with_the_field_named(mutate, field):
    v = values_of(CHART / "ci" / "gpu-vllm-3-values.yaml")
    mutate(v)
    report = helm_python.lint(CHART, v, strict=True)
    text = " ".join(report["errors"]) + " ".join(m["error"] for m in report["messages"])
    assert report["errors"] or report["messages"]
    assert field in text, text
    with pytest.raises(helm_python.HelmError) as e:
        helm_python.Chart.load(CHART).render(v, name="rl", namespace="ml", is_install=True)
    assert field in str(e.value)


def test_an_external_redis_gets_per_service_users_from_the_hook_job(tmp_path):
    """Your own Redis: the pre-install Job runs `mutualrl redis acl --apply` with the admin URL and the users
    Secret's passwords; run here against a real Redis, it creates users each limited to its own streams, and the
    experiment tells MWRA's pods to log in as them."""
    import os
    import subprocess
    import sys

    import redis

    from mutualrl.see.server import RedisServer

    values = values_of(CHART / "ci" / "kueue-external-redis-values.yaml")
    objs = render(values)
    job = next(o for o in objs if o["kind"] == "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    c = job["spec"]["template"]["spec"]["containers"][0]
    users = {"mwra.observer": "obs"} | {f"{p['name']}.{r}": f"pw-{p['name']}-{r}" for p in values["policies"]
                                       for r in ("rollout", "learner")}
    with RedisServer(password="admin-pw") as srv:
        env = {**os.environ}
        for e in c["env"]:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = (f"redis://:admin-pw@127.0.0.1:{srv.port}/0" if ref["name"] == "platform-redis-admin"
                              else users[ref["key"]])
        p = subprocess.run([sys.executable, "-m", "mutualrl.app.cli", *c["args"]], capture_output=True, text=True,
                           env=env, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
        small = redis.Redis(port=srv.port, username="small.rollout", password="pw-small-rollout")
        small.xadd("mutualrl:kueue-run:rollout:small", {"d": b"x"})
        with pytest.raises(redis.exceptions.NoPermissionError):
            small.xadd("mutualrl:kueue-run:rollout:large", {"d": b"x"})
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-experiment"))
    cfg = parse_config(cm["data"]["config.yaml"], "rendered", check_paths=False)
    assert cfg.mwra.kubernetes.redis_users_secret == "mutualrl-redis-users"


def test_engine_sampling_values_reach_the_experiment():
    """engine.topK / topP / temperature were accepted by the schema and never rendered."""
    v = values_of(CHART / "ci" / "cpu-tiny-values.yaml")  # SGT: any sampling settings are allowed
    v["policies"][1]["engine"].update({"topK": 20, "topP": 0.9, "temperature": 0.8})
    cm = next(o for o in render(v) if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-experiment"))
    e = parse_config(cm["data"]["config.yaml"], "rendered", check_paths=False).policies[1].engine
    assert (e.top_k, e.top_p, e.temperature) == (20, 0.9, 0.8)


def test_tracking_values_reach_the_experiment_and_the_learners_only_get_the_credentials():
    v = values_of(CHART / "ci" / "gpu-vllm-3-values.yaml")
    v["tracking"] = {"backends": ["jsonl", "tensorboard", "mlflow"], "mlflow": {"trackingUri": "http://mlflow.mlops:5000"},
                     "tags": {"team": "post-training"}, "credentialsSecret": "mlflow-credentials"}
    objs = render(v)
    config = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-experiment"))
    cfg = parse_config(config["data"]["config.yaml"], check_paths=False)
    assert cfg.tracking.backends == ["jsonl", "tensorboard", "mlflow"]
    assert cfg.tracking.mlflow.tracking_uri == "http://mlflow.mlops:5000"
    assert cfg.tracking.tags == {"team": "post-training"}
    assert cfg.mwra.kubernetes.tracking_secret == "mlflow-credentials"  # MWRA's gangs get it from the file
    for w in policy_workloads(objs):
        c = w["spec"]["template"]["spec"]["containers"][0]
        if w["metadata"]["labels"]["mutualrl.io/role"] == "learner":
            assert c["envFrom"] == [{"secretRef": {"name": "mlflow-credentials"}}]
        else:
            assert "envFrom" not in c
    # the default: TensorBoard event files on the state volume, no secret
    default = render(values_of(CHART / "ci" / "gpu-vllm-3-values.yaml"))
    config = next(o for o in default if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-experiment"))
    assert parse_config(config["data"]["config.yaml"], check_paths=False).tracking.backends == ["jsonl", "tensorboard"]
    assert all("envFrom" not in w["spec"]["template"]["spec"]["containers"][0] for w in policy_workloads(default))


@pytest.mark.parametrize("tracking, field", [
    ({"backends": ["tensorboard"]}, "backends"),
    ({"backends": ["jsonl", "neptune"]}, "backends"),
    ({"mlflow": {"trackingUri": "mlflow.mlops:5000"}}, "trackingUri"),
    ({"credentialsSecret": "Bad_Name"}, "credentialsSecret"),
    ({"wandb": {"mode": "sometimes"}}, "mode"),
])
def test_bad_tracking_values_fail_the_install_naming_the_field(tracking, field):
    v = values_of(CHART / "ci" / "gpu-vllm-3-values.yaml")
    v["tracking"] = tracking
    with pytest.raises(helm_python.HelmError) as e:
        helm_python.Chart.load(CHART).render(v, name="rl", namespace="ml", is_install=True)
    assert field in str(e.value)


def test_model_presets_are_fetched_by_an_init_container_of_the_charts_image():
    values = values_of(VALUES[0]) if VALUES else {}
    values["models"] = {**values.get("models", {}), "existingClaim": "team-models",
                        "presets": ["qwen2.5-coder-0.5b-instruct", "gemma-3-270m"], "acceptLicense": True}
    objs = render(values)
    pods = [w["spec"]["template"]["spec"] for w in policy_workloads(objs)]
    assert pods
    for pod in pods:
        init = [c for c in pod["initContainers"] if c["name"] == "models"][0]
        assert init["command"] == ["mutualrl", "models", "get", "qwen2.5-coder-0.5b-instruct", "gemma-3-270m",
                                   "--cache", "/models/mutualrl", "--accept-license"]
        assert init["image"] == pod["containers"][0]["image"]  # the chart's own image
        claim = [v for v in pod["volumes"] if v["name"] == "models"][0]["persistentVolumeClaim"]
        assert claim["readOnly"] is False  # the init container writes the converted folders
        for c in pod["containers"] + [init]:
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            if c["name"] == "models" or "mutualrl" in c["image"]:
                assert env.get("MUTUALRL_CACHE") == "/models/mutualrl", c["name"]
    with pytest.raises(Exception, match="presets"):
        render({"models": {"presets": ["no-such-model"]}})


def test_the_shared_memory_transport_is_refused_by_the_chart_naming_the_field():
    """A learner and its engine run in two pods here: weights.transport shm cannot join them (compose can); the
    values schema lists the transports the chart runs."""
    values = values_of(VALUES[0]) if VALUES else {}
    values["experiment"] = {**values.get("experiment", {}), "weights": {"transport": "shm"}}
    with pytest.raises(helm_python.HelmError) as e:
        render(values)
    assert "/experiment/weights/transport" in str(e.value) and "'filesystem', 'collective'" in str(e.value)
