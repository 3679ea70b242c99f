"""`mutualrl up`: every service as its own process on loopback, supervised.

Prepares the policies once (tokenizers and warm starts land in the artifact cache, so the
services load instead of recomputing), starts Redis unless the config names one, starts a
rollout service and a learner service per policy, restarts any that crash (up to
``launcher.max_restarts``), prefixes their logs on the console (and keeps them in
``<out>/logs``), and when every learner has spent its budget stops the rest and writes the
same outputs as `mutualrl run`. Ctrl-C / SIGTERM stops everything cleanly.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from mutualrl.config import ConfigError, ExperimentConfig, dump_config
from mutualrl.models.cache import default_cache_dir
from mutualrl.runtime.disk_budget import (
    SERVICE_REMEDY,
    check_room,
    learner_state_bytes,
    moment_bytes,
    parameter_bytes,
    service_disk_need,
    size_text,
    weight_store_need,
)
from mutualrl.runtime.exchange_setup import (
    REDIS_PASSWORD_ENV,
    REDIS_USERNAME_ENV,
    RUN_HMAC_ENV,
    hmac_key,
    probe_broker,
    redis_options,
    run_namespace,
)
from mutualrl.runtime.memory import host_meminfo, return_freed_memory
from mutualrl.runtime.outputs import MetricsWriter, plot_curves, policy_summary, read_metrics, write_summary
from mutualrl.runtime.policy_setup import (
    build_task_from_config,
    eval_log,
    evaluate,
    pass_rate_before_rl,
    prepare_policy,
)
from mutualrl.runtime.serve_args import serve_argv
from mutualrl.see.acl import ServiceUser, acl_file
from mutualrl.see.identity import SEE_KEYS_ENV, format_keys, keys_for_service
from mutualrl.see.server import RedisServer, free_port
from mutualrl.services.learner import StepRecord
from mutualrl.services.learner.ranks import rank_state_path
from mutualrl.services.mwra.demands import demands_from_config
from mutualrl.services.mwra.local import LocalPlan, plan_local
from mutualrl.services.mwra.planner import PlanningError
from mutualrl.weights.groups import resolve_backend
from mutualrl.weights.shm import reclaim, run_tag
from mutualrl.weights.store import KEEP_VERSIONS


@dataclass
class Service:
    """One child process of `mutualrl up` (a rollout or learner service), with its restarts and last output."""
    name: str  # "<policy>.rollout" | "<policy>.learner"
    role: str
    policy: str
    argv: list[str]
    ops_port: int
    grpc_port: int = 0
    proc: subprocess.Popen | None = None
    restarts: int = 0
    done: bool = False
    log_path: Path | None = None
    history: list[int] = field(default_factory=list)  # exit codes
    last_error: str = ""  # the exception that ended its last traceback, or its last error log line
    _in_traceback: bool = False

    def note_output(self, line: str) -> None:
        """Remember the last error: a traceback's final, unindented line (``ExcType: message``)."""
        head = line.lstrip()
        if head.startswith("Traceback") or (head.startswith("╭") and "Traceback" in head):  # plain or rich
            self._in_traceback = True
        elif self._in_traceback and line.strip() and not line[0].isspace() and line[0] not in "│╭╰─":
            if not line.startswith(("During handling", "The above exception")):
                self.last_error = line.strip()[:300]
                self._in_traceback = False
        elif '"level": "error"' in line:
            self.last_error = line.strip()[:300]


class Supervisor:
    """Starts every service of `mutualrl up` from the plan, restarts crashed ones and stops all together."""
    def __init__(self, cfg: ExperimentConfig, out_dir: Path, echo: Callable[[str], None] = print):
        self.cfg = cfg
        self.out = out_dir
        self.echo = echo
        self.services: list[Service] = []
        self.redis: RedisServer | None = None
        self.local_plan: LocalPlan | None = None
        self.failure: str | None = None  # one line: which service kept crashing and its last error
        self.identities: dict[str, ServiceUser] = {}  # service -> its Redis user (when `up` runs Redis)
        self.run_key: str | None = None  # each service gets only the signing keys derived from it that it needs
        self.acl_dir: Path | None = None
        self.state_bytes: dict[str, int] = {}  # each policy's learner state, one copy (prepare measures it)
        self.weights_bytes: dict[str, int] = {}  # and one weights version of it
        self._stopping = threading.Event()

    # ---- setup -----------------------------------------------------------
    def plan(self) -> LocalPlan:
        """MWRA's local backend: devices (GPU host) or threads (CPU host) per service. Runs
        before anything expensive, so a policy that cannot fit even on shared GPUs fails at once."""
        try:
            self.local_plan = plan_local(demands_from_config(self.cfg), self.cfg.mwra.gpus)
        except PlanningError as e:
            raise ConfigError(f"mwra: {e}") from e
        if self.local_plan.shared and self.cfg.weights.transport == "collective":
            same_gpu = [p.name for p in self.cfg.policies if p.engine.facts.in_process and resolve_backend(
                self.cfg.weights.backend, p.engine.backend, p.engine.device) == "nccl"]
            if same_gpu:
                raise ConfigError(f"weights.transport collective over NCCL cannot join a learner and an hf engine on "
                                  f"the same GPU, and this host's GPUs are shared ({', '.join(same_gpu)}): use "
                                  "weights.transport=filesystem here")
        for line in self.local_plan.lines():
            self.echo(f"[up] {line}")
        (self.out / "plan.json").write_text(json.dumps({
            "device": self.local_plan.device, "units": self.local_plan.units, "shared": self.local_plan.shared,
            "services": {f"{p}.{r}": a.env() for (p, r), a in self.local_plan.assignments.items()},
            "plan": self.local_plan.plan.to_dict() if self.local_plan.plan else None,
        }, indent=2))
        return self.local_plan

    def prepare(self) -> dict[str, tuple[float, int, str, int, dict | None]]:
        """Warm starts, starting accuracies and pretrained policies' pass rates before RL (the services then load
        the policies from the cache)."""
        cfg = self.cfg
        task, verifier = build_task_from_config(cfg)
        cache = default_cache_dir()
        out = {}
        for i, p in enumerate(cfg.policies):
            pp = prepare_policy(cfg, i, task, verifier, cache, lambda s: self.echo(f"[up] {s}"))
            self.state_bytes[p.name] = learner_state_bytes(pp.arts.model, moment_bytes(p.optim.state_dtype))
            self.weights_bytes[p.name] = parameter_bytes(pp.arts.model)
            self.check_disk()  # the policies loaded so far: a disk too small for the first is refused at once
            out[p.name] = (evaluate(pp, pp.arts.model, task, verifier, cfg, eval_log(self.out, p.name), 0),
                           pp.warm_steps, pp.arts.source,
                           pp.arts.num_params, pass_rate_before_rl(pp, task, verifier, cfg, self.echo))
            del pp  # one policy's model in this process at a time
            return_freed_memory(collect=True)  # and its pages back to the services this process starts next
        return out

    def check_disk(self, weights: bool = False) -> None:
        """Refuse, before any service starts, a run directory whose disk cannot hold what the services will write
        there: each learner's state files and final checkpoint, and (``weights``: the filesystem transport) the
        versions in ``<out>/weights`` (mutualrl.runtime.disk_budget; a learner service checks its own share again
        when it starts, as it does under Helm or compose). Called as each policy is loaded, before the transport is
        chosen, and once it is."""
        services, names = self.out / "services", list(self.state_bytes)
        resumed = {name: rank_state_path(services, name).is_file() for name in names}
        need = sum(service_disk_need(self.state_bytes[n], resumed[n]) for n in names)
        what = (f"the learner state files and final checkpoints of {', '.join(names)} (weights and optimiser state, "
                f"{size_text(sum(self.state_bytes.values()))} a copy)")
        if weights:
            need += sum(weight_store_need(self.weights_bytes[n], KEEP_VERSIONS, resumed[n]) for n in names)
            what += f" and their weights versions ({size_text(sum(self.weights_bytes.values()))} a version)"
        check_room(self.out, need, what, SERVICE_REMEDY)

    def start(self) -> None:
        """Start Redis (with one ACL user per service) and every service, then write ``services.json``."""
        cfg, out = self.cfg, self.out
        (out / "logs").mkdir(parents=True, exist_ok=True)
        (out / "services").mkdir(parents=True, exist_ok=True)
        url = cfg.broker.url
        namespace = run_namespace(cfg)
        if url is None:
            # our own Redis: one ACL user per service that may append only to its own streams
            self.identities = {f"{p.name}.{role}": ServiceUser(p.name, role, secrets.token_urlsafe(24))
                               for p in cfg.policies for role in ("rollout", "learner")}
            admin = secrets.token_urlsafe(24)
            self.acl_dir = Path(tempfile.mkdtemp(prefix="mutualrl-acl-"))
            acl = self.acl_dir / "users.acl"
            acl.touch(mode=0o600)
            acl.write_text(acl_file(namespace, list(self.identities.values()), admin))
            # AOF: a restart keeps every stream
            self.redis = RedisServer(persistent=True, password=admin, aclfile=str(acl)).start()
            url = f"redis://127.0.0.1:{self.redis.port}/0"  # no credentials: each service gets its own
            self.echo(f"[up] redis {self.redis.binary} on {url} (one ACL user per service)")
        self.services = self.service_specs(url, namespace)
        (out / "services.json").write_text(json.dumps({
            "namespace": namespace, "redis": url.split("@")[-1], "pid": os.getpid(),
            "services": {s.name: {"role": s.role, "policy": s.policy, "ops": f"http://{cfg.launcher.host}:{s.ops_port}",
                                  "grpc": f"{cfg.launcher.host}:{s.grpc_port}" if s.grpc_port else None}
                         for s in self.services},
        }, indent=2))
        for s in self.services:
            self._spawn(s)

    def service_specs(self, url: str, namespace: str) -> list[Service]:
        """Every service of the run with the command it runs (``serve_argv``; the compose file,
        the Helm chart and MWRA's pods run the same)."""
        cfg, out = self.cfg, self.out
        specs = []
        for p in cfg.policies:
            # the collective transport: the learner hosts its weight group's rendezvous on a port of its own
            group = f"{cfg.launcher.host}:{free_port()}" if cfg.weights.transport == "collective" else None
            for role in ("rollout", "learner"):
                ops, grpc_port = free_port(), (free_port() if role == "rollout" else 0)
                argv = [sys.executable, "-m", "mutualrl.app.cli", *serve_argv(
                    role, p.name, config=str(out / "config.yaml"), namespace=namespace, redis=url,
                    weights=str(out / "weights"), out=str(out),
                    ops_port=ops, grpc_port=grpc_port if role == "rollout" else None, weights_group=group)]
                specs.append(Service(f"{p.name}.{role}", role, p.name, argv, ops, grpc_port,
                                     log_path=out / "logs" / f"{p.name}.{role}.log"))
        return specs

    def service_env(self, s: Service) -> dict[str, str]:
        """What a service runs with: the local plan's devices (GPU host) or share of the cores
        (CPU host — a policy's rollout and learner take turns, so they share its cores instead of
        oversubscribing), its signing keys and its Redis identity."""
        plan = self.local_plan or self.plan()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
               **plan.assignments[(s.policy, s.role)].env()}
        if self.run_key:  # its own signing key and its sources' — never the run key itself
            env.pop(self.cfg.broker.hmac_key_env or RUN_HMAC_ENV, None)
            env[SEE_KEYS_ENV] = format_keys(keys_for_service(self.run_key, s.policy, s.role,
                [p.name for p in self.cfg.policies]))
        ident = self.identities.get(s.name)
        if ident is not None:  # in the environment, not on the command line (`ps` shows argv)
            env.update({REDIS_USERNAME_ENV: ident.name, REDIS_PASSWORD_ENV: ident.password})
        return env

    def _spawn(self, s: Service) -> None:
        s.proc = subprocess.Popen(s.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.service_env(s),
                                  text=True, bufsize=1)
        (self.out / "services" / f"{s.name}.pid").write_text(str(s.proc.pid))
        threading.Thread(target=self._pump, args=(s, s.proc), daemon=True).start()

    def _pump(self, s: Service, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None and s.log_path is not None
        with s.log_path.open("a") as f:
            for line in proc.stdout:
                f.write(line)
                f.flush()
                s.note_output(line)
                self.echo(f"[{s.name}] {line.rstrip()}")

    # ---- supervision -----------------------------------------------------
    def supervise(self, poll_s: float = 0.2) -> int:
        """Until every learner finished its budget. Returns 0, or 1 when a service kept crashing."""
        while not self._stopping.is_set():
            for s in self.services:
                if s.done or s.proc is None:
                    continue
                rc = s.proc.poll()
                if rc is None:
                    continue
                s.history.append(rc)
                finished = (self.out / "services" / f"{s.policy}.learner.done").is_file()
                if s.role == "learner" and rc == 0 and finished:
                    s.done = True
                    self.echo(f"[up] {s.name} finished its budget")
                    continue
                if s.restarts >= self.cfg.launcher.max_restarts:
                    self.echo(f"[up] {s.name} exited with {rc} {s.restarts + 1} times; giving up")
                    self.failure = (f"{s.name} crashed {s.restarts + 1} times (exit {rc}); "
                                    f"last error: {s.last_error or 'none printed'}")
                    return 1
                s.restarts += 1
                self.echo(f"[up] {s.name} exited with {rc}; restarting ({s.restarts}/{self.cfg.launcher.max_restarts})")
                self._spawn(s)
            if all(s.done for s in self.services if s.role == "learner"):
                return 0
            time.sleep(poll_s)
        return 130

    def stop(self) -> None:
        """Stop every service (SIGTERM, then SIGKILL after 15 s) and the Redis server it started."""
        self._stopping.set()
        for s in self.services:
            if s.proc is not None and s.proc.poll() is None:
                s.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for s in self.services:
            if s.proc is None:
                continue
            try:
                s.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.proc.wait()
        if self.redis is not None:
            self.redis.cleanup()
            self.redis = None
        if self.acl_dir is not None:
            shutil.rmtree(self.acl_dir, ignore_errors=True)
            self.acl_dir = None
        if self.cfg.weights.transport == "shm":  # a killed learner's slots; a stopped one removed its own
            reclaim(Path(self.cfg.weights.shm_dir), own_prefix=f"mutualrl-{run_tag(self.out / 'weights')}-")


def _sum_counts(dicts) -> dict[str, int]:
    total: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            total[k] = total.get(k, 0) + int(v)
    return total


def merge_outputs(cfg: ExperimentConfig, out: Path, starts: dict[str, tuple[float, int, str, int, dict | None]],
                  restarts: dict[str, int]) -> dict:
    """The same files as `mutualrl run`: metrics.jsonl (one record per policy and step: the last
    write of a step wins, a step retrained after a crash included), curves.png, summary.json."""
    writer = MetricsWriter(out / "metrics.jsonl")
    for name, (acc, *_rest) in starts.items():
        writer.write({"step": 0, "policy": name, "rollouts": 0, "eval_accuracy": acc, "phase": "warm_start"})
    per_policy: dict[str, dict[int, StepRecord]] = {}
    for p in cfg.policies:
        path = out / "services" / f"{p.name}.metrics.jsonl"
        for line in path.read_text().splitlines() if path.is_file() else []:
            rec = StepRecord.from_dict(json.loads(line))
            per_policy.setdefault(p.name, {})[rec.step] = rec
    shared_out: dict[tuple[str, int], int] = {}
    for p in cfg.policies:
        path = out / "services" / f"{p.name}.rollout.ledger.jsonl"
        for line in path.read_text().splitlines() if path.is_file() else []:
            e = json.loads(line)
            shared_out[(p.name, int(e["step"]))] = int(e.get("successes", 0))  # a re-run step: the last write wins
    rollouts: dict[str, int] = {}
    final: dict[str, float] = {n: v[0] for n, v in starts.items()}
    for step in range(1, cfg.budget.steps + 1):
        for p in cfg.policies:
            rec = per_policy.get(p.name, {}).get(step)
            if rec is None:
                continue
            # counted by the learner, not assumed; SGT-R's rescue samples are the policy's rollouts too
            rollouts[p.name] = rollouts.get(p.name, 0) + rec.own_rollouts + rec.rescue_samples()
            rec.rollouts = rollouts[p.name]
            rec.shared_out = shared_out.get((p.name, step), 0)
            if rec.eval_accuracy is not None:
                final[p.name] = rec.eval_accuracy
            writer.write(rec.to_dict())
    writer.close()
    records = read_metrics(out / "metrics.jsonl")
    plot_curves(records, out / "curves.png", title=f"{cfg.name} — sharing: {cfg.sharing.describe()} (services)")
    return write_summary(
        out, cfg.name, cfg.sharing.describe(), cfg.budget.steps,
        {
            name: policy_summary(
                source=src, params=params, warm_start_steps=ws_steps, warm_start_accuracy=acc,
                final_accuracy=final[name],
                rollouts=rollouts.get(name, 0),
                rescue_count=sum(r.rescue_count for r in per_policy.get(name, {}).values()),
                peer_rejections=_sum_counts(r.peer_rejected for r in per_policy.get(name, {}).values()),
                restarts={k: v for k, v in restarts.items() if k.startswith(name + ".")},
                **({"pass_rate_before_rl": pass_rate} if pass_rate is not None else {}),
            )
            for name, (acc, ws_steps, src, params, pass_rate) in starts.items()
        },
        launcher="services",
    )


SHM_MEMORY_SHARE = 0.25
"""`up` picks the shm transport by itself only while its slots (RAM: /dev/shm is memory) stay under this share of
the host's available memory: beside two training processes per policy they would otherwise crowd out activations."""


def _mem_available() -> int:
    """The host's MemAvailable in bytes (0 when unknown)."""
    return host_meminfo().get("MemAvailable", 0)


def _weights_transport(cfg: ExperimentConfig, params: dict[str, int], echo: Callable[[str], None]) -> ExperimentConfig:
    """`up` runs every learner beside its engine on this host: unless the file names a weights transport, hf
    engines take their versions through shared memory (weights.transport=shm) when ``weights.shm_dir`` has room
    for two fp32 versions of every policy, else through the filesystem (said once). A transport the file names
    is kept; shm without the room is refused before any service starts."""
    w = cfg.weights
    if "transport" in w.model_fields_set and w.transport != "shm":
        return cfg
    need = 2 * 4 * sum(params.values())  # two slots of fp32 weights per policy
    try:
        st = os.statvfs(w.shm_dir)
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = 0
    if "transport" in w.model_fields_set:
        if free < need:
            raise ConfigError(f"weights.transport shm: {w.shm_dir} has {free / 2**20:.0f} MiB free and two versions "
                              f"of every policy need {need / 2**20:.0f} MiB: enlarge it or use "
                              "weights.transport=filesystem")
        return cfg
    if any(not p.engine.facts.in_process for p in cfg.policies):
        return cfg
    available = _mem_available()
    if free < need or need > SHM_MEMORY_SHARE * available:
        echo(f"[up] weights through the filesystem: two versions of every policy in shared memory would hold "
             f"{need / 2**20:.0f} MiB of RAM ({w.shm_dir} has {free / 2**20:.0f} MiB, the host "
             f"{available / 2**20:.0f} MiB available); weights.transport=shm asks for it anyway")
        return cfg
    echo(f"[up] weights through shared memory ({w.shm_dir}, two slots per policy; weights.transport sets another)")
    return cfg.model_copy(update={"weights": w.model_copy(update={"transport": "shm"})})


def _weights_deltas(cfg: ExperimentConfig, echo: Callable[[str], None]) -> ExperimentConfig:
    """`up` runs every learner beside its engine on this host, where a delta (docs/algorithms.md §7.3) saves no
    bytes on a wire and costs a copy of the weights in the engine's dtype in the learner (the Qwen2.5-Coder-0.5B's:
    1.2 GiB) and the CPU to compare every value (5 s a version for it on 2 cores): unless the file names
    ``weights.deltas``, versions go whole (said once)."""
    w = cfg.weights
    if "deltas" in w.model_fields_set or w.transport == "collective":  # left out: the default, auto
        return cfg
    echo("[up] weights versions whole: learners and engines share this host (weights.deltas=on sends deltas)")
    return cfg.model_copy(update={"weights": w.model_copy(update={"deltas": "off"})})


def run_services(cfg: ExperimentConfig, out: Path, echo: Callable[[str], None] = print,
                 failure: list | None = None) -> tuple[int, dict | None]:
    """Returns (exit code, summary). A service that kept crashing puts one line naming it and
    its last error into ``failure``."""
    out.mkdir(parents=True, exist_ok=True)
    given = cfg.broker  # as the user wrote it: the fail-fast check reads the key they named, if any
    if cfg.broker.hmac_key_env is None:  # signed by default: a key generated for this run
        cfg = cfg.model_copy(update={"broker": cfg.broker.model_copy(update={"hmac_key_env": RUN_HMAC_ENV})})
        run_key = secrets.token_hex(32)
        echo("[up] messages signed with a key generated for this run (set broker.hmac_key_env to use your own)")
    else:
        run_key = (hmac_key(given) or b"").decode()
    dump_config(cfg, out / "config.yaml")
    sup = Supervisor(cfg, out, echo)
    sup.run_key = run_key
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    interrupted = threading.Event()

    def on_signal(signum, frame):
        interrupted.set()
        sup._stopping.set()

    for sig in previous:
        signal.signal(sig, on_signal)
    try:
        sup.plan()
        if cfg.broker.url is not None:  # fail fast, as `mutualrl run` does, before any warm start
            probe_broker(redis_options(given, given.url))
        starts = sup.prepare()
        cfg = sup.cfg = _weights_deltas(_weights_transport(cfg, {name: v[3] for name, v in starts.items()}, echo),
                                        echo)
        dump_config(cfg, out / "config.yaml")  # again: building the task resolved what the file left open
        # whole versions on disk (a delta's size depends on the step: left out)
        sup.check_disk(weights=cfg.weights.transport == "filesystem" and cfg.weights.deltas == "off")
        sup.start()
        rc = sup.supervise()
    finally:
        sup.stop()
        for sig, h in previous.items():
            signal.signal(sig, h)
    if interrupted.is_set():
        return 130, None
    if rc != 0:
        if failure is not None and sup.failure:
            failure.append(sup.failure)
        return rc, None
    return 0, merge_outputs(cfg, out, starts, {s.name: s.restarts for s in sup.services})
