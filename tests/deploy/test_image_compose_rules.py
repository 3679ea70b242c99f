"""The image (hadolint), the compose file (docker-compose config, generator parity, the commands
`mutualrl up` runs), the alert rules (promtool check + unit tests) and the dashboards (generator
parity, every expression parses)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from conftest import CHART, ROOT

from mutualrl.app.compose import prometheus_config, render
from mutualrl.app.dashboards import all_exprs, render_all
from mutualrl.app.launcher import Supervisor
from mutualrl.config import load_config

CPU = ROOT / "deploy" / "compose" / "experiment.yaml"
GPU = ROOT / "deploy" / "compose" / "experiment-gpu.yaml"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = shutil.which(name) or (str(BIN / name) if (BIN / name).exists() else None)
    assert path, f"{name} is not installed: run `make test-deploy`, which installs it"
    return path


def test_dockerfile_passes_hadolint_with_every_ignore_explained():
    p = subprocess.run([tool("hadolint"), "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert p.returncode == 0 and not p.stdout.strip(), p.stdout
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore=" in line:
            code = line.split("ignore=")[1].strip()
            assert any(code in lines[j] and len(lines[j]) > len(code) + 6 for j in range(max(0, i - 3),
                i)), f"no written reason above {line!r}"


def test_dockerfile_is_multi_stage_non_root_with_a_healthcheck_and_both_flavours():
    text = (ROOT / "Dockerfile").read_text()
    assert text.count("\nFROM ") + text.startswith("FROM ") >= 2
    assert "USER 10001" in text
    assert "HEALTHCHECK" in text
    assert "/healthz" in text
    assert 'ARG FLAVOR=cpu' in text and '"$FLAVOR" = "cuda"' in text.replace("!=", "=") or "cuda" in text
    assert (ROOT / ".dockerignore").is_file()


def test_compose_file_is_the_generators_output():
    cpu, gpu = load_config(CPU, check_paths=False), load_config(GPU, check_paths=False)
    expected = render(cpu, gpu, "deploy/compose/experiment.yaml", "deploy/compose/experiment-gpu.yaml", 4)
    assert (ROOT / "docker-compose.yml").read_text() == expected, (
        "regenerate: mutualrl compose deploy/compose/experiment.yaml deploy/compose/experiment-gpu.yaml")
    assert (ROOT / "deploy" / "prometheus" / "prometheus-compose.yml").read_text() == prometheus_config(cpu, gpu)


def _compose() -> list[str]:
    """docker-compose reading only the environment each test gives it: never a `.env` a user made in the checkout
    (the README tells them to), which would fill in what a test leaves out."""
    empty = Path(tempfile.mkdtemp()) / "empty.env"
    empty.write_text("")
    return [tool("docker-compose"), "--env-file", str(empty)]


def _env_example() -> dict[str, str]:
    lines = (ROOT / "deploy" / "compose" / "env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_docker_compose_config(profile):
    env = {**os.environ, **_env_example(), "COMPOSE_PROFILES": profile}
    p = subprocess.run([*_compose(), "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    # (docker-compose 1.29 lists every service with --services, whatever the profile: read the file)
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    active = {n for n, s in services.items() if "profiles" not in s or profile in s["profiles"]}
    assert {"redis", "controller", "prometheus", "grafana"} <= active
    assert ("llama-char-rollout" in active) == (profile == "cpu")
    assert ("vllm-llama-char" in active) == (profile == "gpu")
    for name in active:
        deps = services[name].get("depends_on", {})
        assert all(d in active for d in deps), (name, deps)
    assert services["llama-char-rollout"]["depends_on"]["redis"] == {"condition": "service_healthy"}
    # Redis starts from the ACL file `mutualrl redis acl` wrote; each service has its own identity
    assert "--aclfile" in services["redis"]["command"]
    assert services["redis"]["depends_on"]["redis-acl"]["condition"] == "service_completed_successfully"
    assert services["redis-acl"]["command"][:2] == ["redis", "acl"]
    for name in active:
        env = services[name].get("environment", {})
        if "MUTUALRL_REDIS_USERNAME" in env:
            policy, role = env["MUTUALRL_REDIS_USERNAME"].split(".")
            assert env["MUTUALRL_REDIS_PASSWORD"].startswith("${MUTUALRL_REDIS_PASSWORD_" + policy.upper().replace("-",
                "_") + "_" + role.upper())


def test_the_compose_acl_job_writes_a_file_redis_enforces(tmp_path):
    """The redis-acl service's command, run here with env.example's passwords, writes an ACL file
    a real Redis loads: a service appends to its own stream and gets NOPERM on another's."""
    import redis

    from mutualrl.see.server import RedisServer

    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    cmd = [a if a != "/acl/users.acl" else str(tmp_path / "users.acl") for a in doc["services"]["redis-acl"]["command"]]
    env = {**os.environ, **_env_example()}
    p = subprocess.run([sys.executable, "-m", "mutualrl.app.cli", *cmd], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    with RedisServer(password=env["MUTUALRL_REDIS_ADMIN_PASSWORD"], aclfile=str(tmp_path / "users.acl")) as srv:
        me = redis.Redis(port=srv.port, username="llama-char.rollout",
                         password=env["MUTUALRL_REDIS_PASSWORD_LLAMA_CHAR_ROLLOUT"])
        me.xadd("mutualrl:compose:rollout:llama-char", {"d": b"x"})
        with pytest.raises(redis.exceptions.NoPermissionError):
            me.xadd("mutualrl:compose:rollout:gpt2-bpe", {"d": b"x"})
        me.close()


def test_compose_without_the_secrets_fails_naming_them():
    for missing in _env_example():  # each secret, left out alone, is named
        if missing == "COMPOSE_PROFILES":
            continue
        env = {**os.environ, **{k: v for k, v in _env_example().items() if k != missing}}
        p = subprocess.run([*_compose(), "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
                           capture_output=True, text=True, env=env, cwd=ROOT)
        assert p.returncode != 0 and missing in p.stderr, missing


def test_compose_services_run_the_commands_up_runs(tmp_path):
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    up = Supervisor(load_config(CPU, check_paths=False), tmp_path).service_specs("redis://127.0.0.1:6379/0", "ns")
    for s in up:
        compose_cmd = doc["services"][f"{s.policy}-{s.role}"]["command"]
        up_args = s.argv[3:]  # after `python -m mutualrl.app.cli`
        flags = lambda argv: [a for a in argv if a.startswith("--")]  # noqa: E731
        assert compose_cmd[:2] == up_args[:2] == ["serve", s.role]
        assert flags(compose_cmd) == flags(up_args)
        assert compose_cmd[compose_cmd.index("--policy") + 1] == s.policy
    gpu_ids = [d["device_ids"] for svc in doc["services"].values() for d in svc.get("deploy", {}).get("resources",
        {}).get("reservations", {}).get("devices", [])]
    flat = [i for ids in gpu_ids for i in ids]
    assert flat and len(flat) == len(set(flat)), "every GPU reserved by exactly one service (the local MWRA plan)"


def test_compose_with_the_collective_transport_points_each_policy_at_its_learner(tmp_path):
    from mutualrl.app.compose import compose_file

    cpu, gpu = (load_config(f, ["weights.transport=collective", "weights.port=29700"], check_paths=False) for f in (CPU,
        GPU))
    services = compose_file(cpu, gpu, "cpu.yaml", "gpu.yaml", 4)["services"]
    up = Supervisor(cpu, tmp_path).service_specs("redis://127.0.0.1:6379/0", "ns")
    for s in up:  # `up` passes the flag too (with its own free port on loopback)
        assert "--weights-group" in s.argv
    for name, svc in services.items():
        role = (svc.get("labels") or {}).get("mutualrl.io/role")
        if role not in ("rollout", "learner"):
            continue
        policy = svc["labels"]["mutualrl.io/policy"]
        learner = f"{policy}-learner" + ("-gpu" if name.endswith("-gpu") else "")
        assert learner in services
        cmd = svc["command"]
        assert cmd[cmd.index("--weights-group") + 1] == f"{learner}:29700", name


def test_alert_rules_check_and_unit_tests():
    p = subprocess.run([tool("promtool"), "check", "rules", str(CHART / "files" / "alerts.yml")], capture_output=True,
                       text=True)
    n = len(yaml.safe_load((CHART / "files" / "alerts.yml").read_text())["groups"][0]["rules"])
    assert p.returncode == 0 and f"{n} rules found" in p.stdout and n == 11, p.stdout + p.stderr
    p = subprocess.run([tool("promtool"), "test", "rules", "alerts_test.yml"], capture_output=True, text=True,
                       cwd=CHART / "files")
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr
    rules = yaml.safe_load((CHART / "files" / "alerts.yml").read_text())["groups"][0]["rules"]
    tested = yaml.safe_load((CHART / "files" / "alerts_test.yml").read_text())
    names = {c["alertname"] for t in tested["tests"] for c in t.get("alert_rule_test", []) if c["exp_alerts"]}
    assert names == {r["alert"] for r in rules}, "every alert has a unit test in which it fires"


def test_dashboards_are_the_generators_output_and_every_expression_parses(tmp_path):
    files = render_all()
    on_disk = {p.name: p.read_text() for p in (CHART / "files" / "dashboards").glob("*.json")}
    assert on_disk == files, "regenerate: python -m mutualrl.app.dashboards"
    assert len(files) == 6
    rules = {"groups": [{"name": "panels",
                         "rules": [{"record": f"panel:{i}", "expr": e} for i, (_, e) in enumerate(all_exprs())]}]}
    (tmp_path / "panels.yml").write_text(yaml.safe_dump(rules))
    p = subprocess.run([tool("promtool"), "check", "rules", str(tmp_path / "panels.yml")], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    for text in files.values():
        d = json.loads(text)
        # every panel queries something; a row only groups the panels after it
        assert d["uid"].startswith("mutualrl-") and d["panels"] and all(p["targets"] for p in d["panels"]
                                                                        if p["type"] != "row")
    sharing = json.loads(files["mutualrl-sharing.json"])  # the sharing graph: a row per receiver, a panel per edge
    rows = [p for p in sharing["panels"] if p["type"] == "row"]
    assert [r["repeat"] for r in rows] == ["receiver"]
    edge = [p for p in sharing["panels"] if p.get("repeat") == "source"]
    assert len(edge) == 1 and "mutualrl_edge_messages_total" in edge[0]["targets"][0]["expr"]
    assert {v["name"] for v in sharing["templating"]["list"]} == {"datasource", "receiver", "source"}


def test_readme_deploy_commands_are_the_tested_ones():
    readme = (ROOT / "README.md").read_text()
    compose = readme.split("## Run with docker-compose")[1].split("## Install on Kubernetes")[0]
    helm = readme.split("## Install on Kubernetes")[1].split("\n## ")[0]
    assert "deploy/compose/env.example" in compose
    assert "mutualrl compose deploy/compose/experiment.yaml deploy/compose/experiment-gpu.yaml" in compose
    named = {w for w in helm.split() if w.startswith("deploy/helm/mutualrl/ci/")}
    assert named and all((ROOT / w).is_file() for w in named), named
    assert named == {str(p.relative_to(ROOT)) for p in (CHART / "ci").glob("*-values.yaml")}


def test_compose_runs_three_policies_under_a_sharing_graph(tmp_path):
    """examples/three-policies.yaml as the cpu profile: a rollout and a learner service per policy, each with
    its own identity, and docker-compose accepts the file."""
    import re

    from mutualrl.app.compose import compose_file

    three = load_config(ROOT / "examples" / "three-policies.yaml", check_paths=False)
    doc = compose_file(three, load_config(GPU, check_paths=False), "three.yaml", "gpu.yaml", 4)
    for policy in ("llama-char", "qwen-bpe", "gpt2-unigram"):
        for role in ("rollout", "learner"):
            svc = doc["services"][f"{policy}-{role}"]
            assert svc["command"][:2] == ["serve", role] and svc["environment"]["MUTUALRL_REDIS_USERNAME"] == (
                f"{policy}.{role}")
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    secrets = set(re.findall(r"\$\{([A-Z0-9_]+):\?", path.read_text()))
    assert "MUTUALRL_REDIS_PASSWORD_GPT2_UNIGRAM_LEARNER" in secrets
    env = {**os.environ, **{s: "x" for s in secrets}, "COMPOSE_PROFILES": "cpu"}
    p = subprocess.run([*_compose(), "-f", str(path), "config", "-q"], capture_output=True, text=True,
                       env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr


# The engine metrics the dashboards may read: names vLLM's V1 engine (vllm/v1/metrics/loggers.py) and SGLang
# (sglang/srt/metrics/collector.py) export today. vLLM deprecated and then removed its V0 cache and swap gauges.
ENGINE_METRICS = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                  "vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:num_preemptions_total",
                  "sglang:gen_throughput", "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"}
REMOVED_ENGINE_METRICS = {"vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc", "vllm:num_requests_swapped",
                          "vllm:gpu_prefix_cache_hit_rate", "vllm:cpu_prefix_cache_hit_rate"}


def test_engine_panels_read_the_metric_names_the_engines_export_today():
    from mutualrl.app.dashboards import metric_names

    used = {n for _, e in all_exprs() for n in metric_names(e) if n.startswith(("vllm:", "sglang:"))}
    assert used and used <= ENGINE_METRICS, used - ENGINE_METRICS
    assert not used & REMOVED_ENGINE_METRICS


def test_the_cuda_image_pins_the_engine_release_the_chart_runs():
    import re

    from mutualrl.services.mwra.backends.k8s_objects import engine_container

    docker = (ROOT / "Dockerfile").read_text()
    pins = dict(re.findall(r"^ARG (VLLM|SGLANG)_VERSION=(\S+)$", docker, re.M))
    assert set(pins) == {"VLLM", "SGLANG"}
    assert 'vllm==${VLLM_VERSION}' in docker and 'sglang==${SGLANG_VERSION}' in docker
    chart = (CHART / "templates" / "policies.yaml").read_text() + (CHART / "values.yaml").read_text()
    for backend, repo in (("vllm", "vllm/vllm-openai"), ("sglang", "lmsysorg/sglang")):
        tag = f"{repo}:v{pins[backend.upper()]}"
        assert engine_container({"backend": backend}, 1)["image"] == tag  # MWRA's default
        assert tag in chart
        assert not set(re.findall(rf"{re.escape(repo)}:v[\w.]+", chart)) - {tag}


def test_every_alert_links_its_runbook_section_in_docs_deploy():
    rules = yaml.safe_load((CHART / "files" / "alerts.yml").read_text())["groups"][0]["rules"]
    headings = {line[4:].strip().lower() for line in (ROOT / "docs" / "deploy.md").read_text().splitlines()
                if line.startswith("### ")}
    for r in rules:
        url = r["annotations"]["runbook_url"]
        assert url.startswith("https://github.com/mutualrl/mutualrl/blob/main/docs/deploy.md#"), url
        assert url.rsplit("#", 1)[1] == r["alert"].lower() and r["alert"].lower() in headings, r["alert"]


def test_compose_with_the_shared_memory_transport_shares_the_learners_ipc_with_its_rollout(tmp_path):
    """weights.transport shm: the learner's /dev/shm (sized; Docker's default 64 MB holds no model) is the rollout
    service's too; docker-compose accepts the file."""
    from mutualrl.app.compose import compose_file

    cpu, gpu = (load_config(f, ["weights.transport=shm"] if f == CPU else [], check_paths=False) for f in (CPU, GPU))
    doc = compose_file(cpu, gpu, "cpu.yaml", "gpu.yaml", 4)
    services = doc["services"]
    for p in cpu.policies:
        learner, rollout = services[f"{p.name}-learner"], services[f"{p.name}-rollout"]
        assert learner["ipc"] == "shareable" and learner["shm_size"] == "4gb"
        assert rollout["ipc"] == f"service:{p.name}-learner"
    (tmp_path / "docker-compose.yml").write_text(yaml.safe_dump(doc))
    for f in ("cpu.yaml", "gpu.yaml"):
        (tmp_path / f).write_text("")
    env = {**os.environ, **_env_example(), "COMPOSE_PROFILES": "cpu"}
    p = subprocess.run([*_compose(), "-f", str(tmp_path / "docker-compose.yml"), "config", "-q"], capture_output=True,
                       text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
