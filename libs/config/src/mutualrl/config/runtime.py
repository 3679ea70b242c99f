"""Where and how a run runs: the experience exchange's broker, checkpoints, the weight transport, the launcher and
MWRA."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from mutualrl.config.kubernetes import KubernetesConfig
from mutualrl.config.strict import Strict as _Strict


class BrokerConfig(_Strict):
    """SEE transport (README "Experience exchange" lists the stream and group names)."""

    backend: Literal["inprocess", "redis"] = Field("inprocess",
                                                   description="inprocess (embedded default) or redis (Redis Streams).")
    url: Optional[str] = Field(None, description="redis:// or rediss:// URL; None with backend redis starts a local "
                               "server for the run.")
    username: Optional[str] = Field(None, description="Redis ACL user.")
    password_env: Optional[str] = Field(None, description="Environment variable holding the Redis password (never put "
                                        "it in the file).")
    tls: bool = Field(False, description="TLS to Redis (implied by rediss://).")
    tls_ca_certs: Optional[str] = Field(None, description="CA bundle for TLS.")
    tls_certfile: Optional[str] = Field(None, description="Client certificate for mutual TLS.")
    tls_keyfile: Optional[str] = Field(None, description="Client key for mutual TLS.")
    hmac_key_env: Optional[str] = Field(None, description="Name of an environment variable holding the run key every "
                                        "service's signing key derives from (a service given its "
                                        "own keys in MUTUALRL_SEE_KEYS uses those instead).")
    max_len: int = Field(100_000, ge=1, description="Retention bound per stream (entries).")
    max_age_s: Optional[float] = Field(None, gt=0, description="Retention bound per stream (age); None keeps entries "
                                       "until max_len.")
    max_backlog: Optional[int] = Field(None, ge=1, description="Backpressure: entries a stream may hold unfinished by "
                                       "its slowest receiver; None = unbounded.")
    on_backlog: Literal["block", "drop"] = Field("block",
                                                 description="At max_backlog: wait for receivers (block) or skip and "
                                                 "count (drop).")
    block_timeout_s: float = Field(60.0, gt=0, description="How long a blocked publisher waits before failing.")

    @model_validator(mode="after")
    def _check(self) -> "BrokerConfig":
        if self.url and self.backend != "redis":
            raise ValueError("broker.url is only used with broker.backend: redis")
        if self.url and not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"broker.url must start with redis://, rediss:// or unix://; got {self.url!r}")
        if self.max_backlog is not None and self.max_backlog > self.max_len:
            raise ValueError("broker.max_backlog must not exceed broker.max_len (trimming would drop unread entries)")
        return self


class CheckpointConfig(_Strict):
    """How often a learner makes its state durable: a learner service's checkpoints (`mutualrl up`, the chart,
    compose) and the resume points of `mutualrl run`."""

    every: int = Field(1, ge=1, description="Checkpoint every K steps; the messages those steps used are acknowledged "
                       "at the checkpoint, and a crash redoes the steps since the last one (a 7B "
                       "learner need not write its state every step).")
    resume_every: int = Field(0, ge=0, description="`mutualrl run` (and each run of `mutualrl compare`): write a "
                              "resume point of every policy (weights, optimiser, counters, random state) every K "
                              "steps, 0 for none. Started again on the same --out with the same config, the run "
                              "goes on from the newest one instead of step 1; it is removed once the run finished. "
                              "About 12 bytes per parameter (fp32 weights and AdamW), written in one atomic file: "
                              "the run checks for room for it, a new one beside it and the final checkpoints "
                              "before it trains.")


class WeightsConfig(_Strict):
    """How a learner's new weights reach its rollout engine (docs/architecture.md, "Weight transport")."""

    transport: Literal["filesystem", "collective", "shm"] = Field(
        "filesystem",
        description="filesystem: a safetensors checkpoint per version in a shared directory; collective: "
                    "broadcast from the learner into the engine's workers over a process group of their own (NCCL "
                    "on GPUs, gloo on CPU), nothing written to disk; shm: a learner and its hf engine on one host "
                    "exchange each version through two slots in shared memory (`mutualrl up` picks it when this is "
                    "left unset; compose shares the learner's IPC namespace with its rollout service). `mutualrl "
                    "run` keeps both ends in one process and passes weights in memory either way.")
    shm_dir: str = Field("/dev/shm", description="shm: where the slots live (a memory-backed filesystem).")
    backend: Literal["auto", "gloo", "nccl"] = Field("auto",
                                                     description="collective: the group's backend; auto = nccl when "
                                                     "the engine runs on a GPU (vllm/sglang, or hf on "
                                                     "cuda), gloo otherwise. A vLLM server always takes "
                                                     "NCCL.")
    port: int = Field(29600, ge=1024, le=65535, description="collective, outside `mutualrl up` (compose, Helm): the "
                      "learner hosts the group's rendezvous on this port; `up` "
                      "picks a free port per policy.")
    timeout_s: float = Field(600.0, gt=0, description="collective: how long the two ends wait for each other "
                             "(rendezvous and each version).")
    deltas: Literal["auto", "on", "off"] = Field(
        "auto",
        description="filesystem and shm, hf engines: send a version as the values that changed since the one before "
                    "it, in the dtype the engine samples in, compressed, and rebuilt bit for bit on the engine "
                    "(docs/algorithms.md §7.3). auto: on when the engine samples in bf16 or fp16 (most fp32 values "
                    "change every step, so deltas would not pay), except under `mutualrl up` when the file leaves "
                    "it out (one host: no wire to save, and the learner would hold the base); on: always (a "
                    "version whose delta is over delta_max_share goes whole); off: every version whole. The "
                    "learner keeps one copy of the weights in the engine's dtype as the next delta's base.")
    delta_max_share: float = Field(0.5, gt=0, le=1, description="A delta larger than this share of the whole "
                                   "version's bytes is not sent: the version goes whole.")
    share_in_process: bool = Field(True, description="`mutualrl run` with synchronous sampling (async.max_staleness "
                                   "0) and an hf engine: the engine samples the learner's own module, no copy of the "
                                   "weights (the same numbers: it samples step t's rollouts after step t-1's update "
                                   "and before step t's). false keeps a copy per engine and per version in memory.")


class LauncherConfig(_Strict):
    """How `mutualrl up` runs the services (`mutualrl run` ignores all but `kind`)."""

    kind: Literal["embedded"] = Field("embedded", description="`mutualrl run`: every worker in one process.")
    rollout_deadline_s: float = Field(60.0, gt=0, description="A learner waits this long for its own step's rollouts, "
                                      "then trains on what arrived (or skips).")
    peer_deadline_s: float = Field(10.0, ge=0, description="A learner waits this long for peers to finish the step, "
                                   "then trains without them (never deadlocks).")
    max_restarts: int = Field(3, ge=0, description="Restarts per service after a crash before `up` gives up.")
    host: str = Field("127.0.0.1", description="Interface the services bind (loopback by default).")
    grpc_tls_cert: Optional[str] = Field(None, description="PEM certificate (chain) of the rollout gRPC port; with "
                                         "grpc_tls_key it serves TLS only.")
    grpc_tls_key: Optional[str] = Field(None, description="PEM private key of grpc_tls_cert.")

    @model_validator(mode="after")
    def _tls_pair(self) -> "LauncherConfig":
        if bool(self.grpc_tls_cert) != bool(self.grpc_tls_key):
            raise ValueError("launcher.grpc_tls_cert and launcher.grpc_tls_key go together")
        return self


class MwraConfig(_Strict):
    """Multi-Worker Resource Allocation: how many GPUs each policy and role gets."""

    backend: Literal["local", "kubernetes"] = Field("local",
                                                    description="local: `mutualrl up` on this host; kubernetes: "
                                                    "`mutualrl controller` creates the gangs.")
    gpus: Optional[int] = Field(None, ge=1, description="GPUs to plan; None = the GPUs torch sees on this host "
                                "(local) or the cluster's allocatable (kubernetes).")
    node_gpus: int = Field(8, ge=1, description="GPUs per node when gpus is given (the local host is one node).")
    min_gain: float = Field(0.10, ge=0, lt=1, description="Re-plan only when the predicted step is more than this "
                            "much faster...")
    move_cost_s: float = Field(120.0, ge=0, description="...and the seconds saved over the remaining steps exceed "
                               "this cost of moving.")
    ema_alpha: float = Field(0.2, gt=0, le=1, description="Weight of the newest measured step in the cost average.")
    gpu_flops: float = Field(400e12, gt=0, description="Peak bf16 FLOP/s of one GPU, for seeding step costs before "
                             "any are measured.")
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)
