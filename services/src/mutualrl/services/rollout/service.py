"""The rollout service of one policy: a gRPC RolloutService plus the worker loop that samples
each step's prompts, verifies them and publishes experience through SEE.

Bounded staleness (docs/algorithms.md §6): step t is sampled only once the learner announced
step t−1−k (``async.max_staleness: k``; k = 0 alternates strictly) and the newest weights version
it published is loaded (the engine serves nothing for a version it has not finished loading), so
with k > 0 the next steps are sampled while the learner trains. After a restart it resumes at the
learner's next step, or past the last step its ledger recorded (never sampling a step twice); with the
collective transport, a version broadcast before it rejoined is asked for again (an
``awaiting_weights`` heartbeat) rather than sampled past.

The engine runs on the service's main thread only (mutualrl.runtime.owner_thread): the weights follower, the rescue
responder and the gRPC handlers hand their loads and generations to it, and it runs them whenever it waits.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from prometheus_client import CollectorRegistry

from mutualrl.models.policy import context_limit
from mutualrl.runtime.distributor import PromptDistributor
from mutualrl.runtime.faults import fault_point
from mutualrl.runtime.http_endpoints import OpsServer
from mutualrl.runtime.owner_thread import OwnerThread
from mutualrl.runtime.policy_setup import prepare_policy, prompt_style
from mutualrl.runtime.service_common import ServiceArgs, ServiceContext, service_logger, stop_flag
from mutualrl.runtime.shard import shard_from_env
from mutualrl.services.rollout.factory import build_engine, join_engine_group, rollout_transport
from mutualrl.services.rollout.metrics import RolloutMetrics
from mutualrl.services.rollout.owned_engine import OwnedEngine
from mutualrl.services.rollout.rescue_responder import SampleResponder
from mutualrl.services.rollout.server import RolloutServicer, serve, update_weights_token
from mutualrl.services.rollout.setup import make_worker
from mutualrl.v1 import experience_pb2 as pb
from mutualrl.weights.deltas import DeltaReceiver
from mutualrl.weights.handshake import WeightsFollower, newest_announced


def _tls(launcher) -> tuple[bytes, bytes] | None:
    """The gRPC server's certificate and key, when the launcher names both."""
    if launcher.grpc_tls_cert and launcher.grpc_tls_key:
        return Path(launcher.grpc_tls_cert).read_bytes(), Path(launcher.grpc_tls_key).read_bytes()
    return None


def _resume_step(learner_step: int, ledger: Path) -> int:
    """The step to sample first: the learner's next one, or past the last step this service's ledger says it
    published (those rollouts wait in the stream for the learner). A step is never sampled twice: the learner
    takes two different copies of a sample as a conflict and trains neither (docs/architecture.md, "Threat
    model"); only a step whose ledger line a crash lost is sampled again — with the same seed and weights, so
    the same samples (duplicates, not conflicts), unless the weights moved on meanwhile."""
    step = learner_step + 1
    if ledger.is_file():
        for line in ledger.read_text().splitlines():
            try:
                step = max(step, int(json.loads(line)["step"]) + 1)
            except (ValueError, KeyError, TypeError):  # a line torn by a crash mid-write: that step is sampled again
                continue
    return step


def _report_step(ctx: ServiceContext, policy: str, step: int, res, version: int, ledger, metrics: RolloutMetrics,
                 log) -> None:
    """What a sampled step leaves behind: its ledger line (the messages it published), its metrics, a heartbeat
    with its stage seconds, and a log line."""
    ledger.write(json.dumps({"step": step, "rollouts": res.message_ids, "successes": res.successes_published,
                             "weights_version": version}) + "\n")
    ledger.flush()
    stages = {"generate": res.generate_s}
    metrics.observe(step, res.published, res.successes_published, stages, res.tokens, version)
    beat = pb.Heartbeat(role="rollout", step=step, version=version, status="ok", stage_seconds=stages,
                        tokens=res.tokens)
    ctx.exchange.publish(beat, f"{policy}.rollout")
    log.info("step", extra={"fields": {"step": step, "published": res.published,
                                       "successes": res.successes_published, "reward_mean": res.reward_mean}})


class RolloutService:
    """A policy's rollout service: ``start`` builds its engine and serves gRPC and its ops endpoints, ``run``
    samples each step with the newest weights until the budget is sampled (then keeps serving weights updates
    and Generate until told to stop), ``health`` is what ``/healthz`` answers, ``stop`` closes what ``start``
    opened."""

    def __init__(self, args: ServiceArgs):
        self.args = args
        self.stopping = stop_flag()
        self.log = service_logger(f"{args.policy}.rollout")
        self.ctx = ServiceContext(args)
        self.step = 0  # the last step sampled
        self.owner = OwnerThread()  # the main thread: the only one that runs the engine

    def start(self) -> RolloutService:
        """The engine on the policy's weights, joined to the learner's weight group when collective; the gRPC
        server, the ops endpoints, the weights follower and the rescue responder running."""
        ctx, args, log = self.ctx, self.args, self.log
        cfg, p = ctx.cfg, ctx.policy_cfg
        pp = prepare_policy(cfg, ctx.index, ctx.task, ctx.verifier, ctx.cache, log.info, log.warning)
        collective = cfg.weights.transport == "collective"
        if collective:
            log.info("joining the learner's weight group",
                     extra={"fields": {"address": args.weights_group, "engine": p.engine.backend}})
        store = rollout_transport(cfg, ctx.index, args.weights_dir, args.weights_group,
                                  newest=lambda: newest_announced(ctx.exchange, p.name))
        self.engine = engine = build_engine(p.engine, pp.arts.model, pp.arts.tokenizer, store,
                                            p.model.path or pp.arts.source, collective=collective,
                                            precision=pp.precision, adopt=True)
        join_engine_group(cfg, ctx.index, engine, args.weights_group)
        if isinstance(store, DeltaReceiver):  # deltas are rebuilt on the tensors this engine serves
            store.attach(engine.model.state_dict, lambda: engine.info().weights_version)
        # what the other threads call: an in-process engine's work is handed to the main thread (a server's is not
        # this process's torch work, and it takes concurrent requests)
        shared = OwnedEngine(engine, self.owner) if engine.facts.in_process else engine
        registry = CollectorRegistry()
        keyring = ctx.exchange.codec.keyring  # UpdateWeights: the learner's identity (its signing key) authenticates
        key = keyring.key(f"{p.name}.learner") if keyring is not None else None
        context = context_limit(pp.arts.model.config)
        servicer = RolloutServicer(p.name, shared, pp.arts.tokenizer, pp.arts.fingerprint, registry,
                                   prompt_style(cfg, p), max_context=context,
                                   announced=partial(_announced, ctx.exchange, p.name),
                                   update_token=update_weights_token(key, p.name) if key else None)
        self.server, self.grpc_port = serve(servicer, cfg.launcher.host, args.grpc_port, tls=_tls(cfg.launcher))
        self.metrics = metrics = RolloutMetrics(p.name, registry, ctx.exchange)
        self.ops = OpsServer(registry, self.health, cfg.launcher.host, args.ops_port).start()
        self.worker = make_worker(cfg, pp, engine, ctx.exchange, ctx.verifier)
        self.distributor = PromptDistributor(ctx.task.train, cfg.budget.prompts_per_step, seed=cfg.seed)
        self.shard = shard = shard_from_env()  # replica i of n samples prompts i, i+n, ... of every step
        ledger_path = ctx.state_dir / f"{p.name}.rollout{shard.suffix}.ledger.jsonl"
        self.next_step = _resume_step(ctx.last_step("learner"), ledger_path)
        self.ledger = ledger_path.open("a")
        log.info("serving", extra={"fields": {"grpc_port": self.grpc_port, "ops_port": self.ops.port,
                                              "resume_step": self.next_step,
                                              "replica": f"{shard.index + 1} of {shard.count}"}})
        self.follower = follower = WeightsFollower(
            p.name, ctx.exchange, store, shared.update_weights, lambda: engine.info().weights_version,
            collective=collective, log=log, on_loaded=lambda v: _loaded(servicer.metrics, p.name, v, follower),
            on_refused=lambda v, e: metrics.refused.labels(p.name).inc())
        self.worker.weights_step = follower.served_step
        follower.follow(self.stopping)
        _answer_rescue_requests(ctx, shared, self.worker.sampling, context, log, shard.index, self.stopping)
        return self

    def health(self) -> dict:
        """What ``/healthz`` answers: the engine's status, the step, the served weights version and its lag."""
        info = self.engine.info()
        return {"status": self.engine.health(), "role": "rollout", "policy": self.args.policy, "step": self.step,
                "weights_version": info.weights_version,
                "lag": max(0, self.ctx.last_step("learner") - info.weights_version), "grpc_port": self.grpc_port}

    def run(self) -> int:
        """Sample every step of the budget under bounded staleness, then serve until told to stop."""
        ctx, cfg, p = self.ctx, self.ctx.cfg, self.ctx.policy_cfg
        ahead, step = cfg.async_.max_staleness, self.next_step
        while step <= cfg.budget.steps and not self.stopping.is_set():
            # bounded staleness: the learner finished step t-1-k and its newest version is served
            if not ctx.wait_for(lambda: ctx.last_step("learner") >= step - 1 - ahead and self.follower.caught_up(),
                                3600, self.stopping, idle=self.owner.run_pending):
                break
            # crash tests: the weights are loaded, nothing sampled
            fault_point("rollout_before_sample", step, ctx.state_dir, p.name)
            res = self.worker.run_step(step, self.shard.take(self.distributor.batch(step)))
            _report_step(ctx, p.name, step, res, res.weights_version, self.ledger, self.metrics, self.log)
            self.step = step
            step += 1
        # the budget is sampled: keep serving (weights updates, Generate) until told to stop
        while not self.stopping.is_set():
            self.owner.run_pending(0.1)
        self.follower.check()
        return 0

    def stop(self) -> None:
        """Close what ``start`` opened: the gRPC server, the ops endpoints, the ledger; calls still waiting for the
        main thread are refused."""
        self.owner.close()
        self.server.stop(grace=2)
        self.ops.stop()
        self.ledger.close()
        self.log.info("stopped")


def run_rollout_service(args: ServiceArgs) -> int:
    """A policy's rollout service, from start to stop (the process's main)."""
    service = RolloutService(args).start()
    try:
        return service.run()
    finally:
        service.stop()


def _announced(exchange, policy: str) -> tuple[int, str] | None:
    """The newest (version, checksum) this policy's learner announced on SEE."""
    wp = exchange.last("weights_published", policy)
    return (int(wp.payload.version), wp.payload.checksum) if wp is not None else None


def _answer_rescue_requests(ctx: ServiceContext, engine, spec, context: int | None, log, replica: int, stop) -> None:
    """Answer the learner's rescue requests (SGT-R's second round: rescue_responder.py) in a thread. It runs whatever
    the mode: a learner whose mode samples no rescues sends none, and an idle thread blocked on an empty stream
    costs nothing."""
    name = ctx.policy_cfg.name
    SampleResponder(name, ctx.exchange, engine, spec, lambda: ctx.last_step("learner"), max_context=context, log=log,
                    consumer=str(replica)).serve(stop)


def _loaded(metrics, policy: str, version: int, follower: WeightsFollower) -> None:
    """A weights version is served: its number and how long it took to load."""
    metrics.version.labels(policy, "rollout").set(version)
    metrics.sync.labels(policy, "rollout").set(follower.last_load_s)
