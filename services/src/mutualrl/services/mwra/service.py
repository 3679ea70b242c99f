"""MWRA's service (`mutualrl controller`): the control API over a backend, with a reconcile loop and a heartbeat
follower beside it, as a small class with the verbs every service has (start / run / health / stop)."""

from __future__ import annotations

import threading
from pathlib import Path

from mutualrl.config import parse_config
from mutualrl.services.mwra.api import controller_health, create_app, read_token
from mutualrl.services.mwra.backends.base import Backend, InMemoryBackend
from mutualrl.services.mwra.controller import Controller
from mutualrl.services.mwra.heartbeats import HeartbeatFollower
from mutualrl.services.mwra.planner import Node


def _nodes(gpus: int, node_gpus: int) -> list[Node]:
    full, rest = divmod(gpus, node_gpus)
    return [Node(f"node-{i}", node_gpus) for i in range(full)] + ([Node(f"node-{full}", rest)] if rest else [])


def build_backend(kind: str, gpus: int | None, node_gpus: int, namespace: str, gang: str, kubeconfig: str | None,
                  admission_timeout_s: float):
    """(backend, leader election or None). ``gpus`` on kubernetes: plan on that many instead of
    listing nodes (a controller without the ClusterRole to read them)."""
    if kind == "memory":
        return InMemoryBackend(_nodes(gpus or 16, node_gpus)), None
    from kubernetes import client, config

    from mutualrl.services.mwra.backends.kubernetes import KubernetesBackend, LeaderElection

    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig)
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
    api = client.ApiClient()
    static = _nodes(gpus, node_gpus) if gpus else None
    return KubernetesBackend(api, namespace, gang=gang, admission_timeout_s=admission_timeout_s,
                             static_nodes=static), LeaderElection(api, namespace)


def heartbeat_connector(redis_url: str):
    """``connect(exp)`` for the follower: the experiment's SEE namespace (its run id) on the
    Redis the pods use, signed with the key its config names (read from this process's env)."""
    from mutualrl.runtime.exchange_setup import redis_options, see_keys
    from mutualrl.see import ExperienceExchange, RedisBroker

    def connect(exp):
        b = exp.config.broker
        return ExperienceExchange(RedisBroker(redis_options(b, redis_url)), exp.id, keys=see_keys(b))

    return connect


def reconcile_forever(controller: Controller, every_s: float, stop: threading.Event, log=print,
                      follower: HeartbeatFollower | None = None) -> None:
    """The controller's loop: reconcile every ``every_s`` seconds (and fold in heartbeats) until ``stop``; an error is
    logged, not fatal."""
    while not stop.is_set():
        try:
            controller.tick()
            if follower is not None:
                follower.poll_once()
        except Exception as e:  # noqa: BLE001 - a failed reconcile is retried on the next tick, never fatal
            log(f"reconcile failed: {type(e).__name__}: {e}")
        stop.wait(every_s)


class MwraService:
    """The MWRA controller as a service: ``start`` builds the controller (applying the chart's experiment, when
    ``submit`` names one) and starts the reconcile loop; ``run`` serves the HTTP API until the process is told to
    stop; ``health`` is what ``/healthz`` answers; ``stop`` ends the reconcile loop."""

    def __init__(self, backend: Backend, leader, host: str, port: int, every_s: float = 5.0,
                 submit: Path | None = None, redis_url: str | None = None, **controller_kwargs):
        self.backend, self.leader, self.host, self.port = backend, leader, host, port
        self.every_s, self.submit, self.redis_url = every_s, submit, redis_url
        self.controller_kwargs = controller_kwargs
        self.stopping = threading.Event()

    def start(self) -> MwraService:
        """The controller, the chart's experiment applied, the reconcile loop (and heartbeat follower) running."""
        self.token = read_token()
        self.controller = controller = Controller(self.backend, leader=self.leader, **self.controller_kwargs)
        if self.submit is not None:
            # the chart's experiment, under a fixed id: a restarted controller re-applies the same run
            text = self.submit.read_text()
            cfg = parse_config(text, str(self.submit), check_paths=False)
            controller.submit(cfg, text, exp_id=cfg.name.lower().replace("_", "-").replace(".", "-")[:40])
        follower = HeartbeatFollower(controller, heartbeat_connector(self.redis_url)) if self.redis_url else None
        threading.Thread(target=reconcile_forever, args=(controller, self.every_s, self.stopping),
                         kwargs={"follower": follower}, daemon=True).start()
        return self

    def health(self) -> dict:
        """What ``/healthz`` answers (the API serves it: mutualrl.services.mwra.api)."""
        return controller_health(self.controller)

    def run(self) -> int:
        """Serve the control API until the process is told to stop (uvicorn handles SIGINT and SIGTERM)."""
        import uvicorn

        uvicorn.run(create_app(self.controller, self.token, self.health), host=self.host, port=self.port,
                    log_level="warning")
        return 0

    def stop(self) -> None:
        """End the reconcile loop."""
        self.stopping.set()


def serve_controller(backend: Backend, leader, host: str, port: int, every_s: float = 5.0, submit: Path | None = None,
                     redis_url: str | None = None, **controller_kwargs) -> None:
    """Run the MWRA controller: its HTTP API, the reconcile loop and, with ``redis_url``, the heartbeat follower."""
    service = MwraService(backend, leader, host, port, every_s, submit, redis_url, **controller_kwargs).start()
    try:
        service.run()
    finally:
        service.stop()
