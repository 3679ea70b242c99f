"""The command line of one service (no heavy imports: the controller and chart tests use it)."""

from __future__ import annotations


def serve_argv(role: str, policy: str, *, config: str, namespace: str, redis: str, weights: str, out: str,
               ops_port: int, grpc_port: int | None = None,
               weights_group: str | None = None) -> list[str]:
    """The arguments of ``mutualrl serve <role>``: the one definition `mutualrl up`, the compose
    file, the Helm chart and MWRA's Kubernetes pods all run, so they cannot drift apart.
    ``weights_group`` (``host:port``): where the learner hosts its weight group's rendezvous
    when the run's weights transport is collective."""
    if role not in ("rollout", "learner"):
        raise ValueError(f"role must be rollout or learner, got {role!r}")
    argv = ["serve", role, "--policy", policy, "--ops-port", str(ops_port), "--config", config, "--namespace",
            namespace,
            "--redis", redis, "--weights", weights, "--out", out]
    if role == "rollout":
        argv += ["--grpc-port", str(grpc_port if grpc_port is not None else 50051)]
    if weights_group:  # the collective transport: the learner's rendezvous, host:port
        argv += ["--weights-group", weights_group]
    return argv
