"""The learner service of one policy: drives its :class:`~mutualrl.services.learner.loop.LearnerLoop`
(train, evaluate, checkpoint, acknowledge: exactly once across restarts), writes the durable
records, heartbeats, answers a rollout service that asks for the weights again and serves its
metrics. Under ``async.peers: lockstep`` peers are waited for at most ``launcher.peer_deadline_s`` per
step; under ``bounded`` never (their experience is used when it is within ``sharing.max_version_lag``).

A resumed learner re-announces its checkpointed step (rollout servers wait on it) and continues
weights versions after the newest it announced.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch.distributed as dist

from mutualrl.models.sharding import shard_policy
from mutualrl.runtime.disk_budget import (
    SERVICE_REMEDY,
    check_room,
    learner_state_bytes,
    moment_bytes,
    service_disk_need,
    size_text,
)
from mutualrl.runtime.distributor import PromptDistributor
from mutualrl.runtime.http_endpoints import OpsServer
from mutualrl.runtime.outputs import save_checkpoint
from mutualrl.runtime.policy_setup import eval_log, evaluate
from mutualrl.runtime.service_common import ServiceArgs, ServiceContext, service_logger, stop_flag
from mutualrl.see.server import free_port
from mutualrl.services.learner.loop import Checkpoints, LearnerLoop
from mutualrl.services.learner.metrics import LearnerMetrics
from mutualrl.services.learner.ranks import (
    RankGroup,
    init_group,
    learner_world,
    rank_argv,
    rank_device,
    rank_state_path,
)
from mutualrl.services.learner.setup import learner_transport, service_learner
from mutualrl.services.learner.step_record import StepRecord
from mutualrl.tracking import open_tracker
from mutualrl.tracking.identity import run_info
from mutualrl.v1 import experience_pb2 as pb
from mutualrl.weights.deltas import DeltaSender
from mutualrl.weights.shm import ShmSender


def _write_missing(path, records: list[StepRecord]) -> None:
    """Append the checkpoint's records the metrics file lacks (a crash after the checkpoint,
    before they were written), and drop records of steps after it (they are redone)."""
    done = max((r.step for r in records), default=0)
    kept, have = [], set()
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line
            if rec.get("step", 0) <= done and rec.get("step") not in have:
                kept.append(line)
                have.add(rec.get("step"))
    kept += [json.dumps(r.to_dict()) for r in records if r.step not in have]
    path.write_text("".join(line + "\n" for line in kept))


class LearnerService:
    """A policy's learner service: ``start`` starts the other ranks of a sharded learner, builds the learner and
    its loop, resumes from the checkpoint and serves the ops endpoints; ``run`` trains the remaining steps (and
    writes the final checkpoint once the budget is done); ``health`` is what ``/healthz`` answers; ``stop``
    closes what ``start`` opened."""

    def __init__(self, args: ServiceArgs):
        self.args = args
        self.stopping = stop_flag()
        self.log = service_logger(f"{args.policy}.learner")
        self.ctx = ServiceContext(args)
        self.ranks: RankGroup | None = None
        self.step = 0  # the last step trained
        self.ops = self.tracker = self.metrics_file = self.store = None

    def start(self) -> LearnerService:
        """Ranks, learner, loop (resumed), metrics, tracker and ops endpoints."""
        args, ctx, log = self.args, self.ctx, self.log
        cfg, p = ctx.cfg, ctx.policy_cfg
        if cfg.weights.transport == "collective":
            log.info("hosting the weight group",
                     extra={"fields": {"address": args.weights_group, "engine": p.engine.backend}})
        world = learner_world(p)
        self.ranks = ranks = _start_ranks(args, cfg, p, world, log) if world > 1 else None
        self.store = learner_transport(cfg, ctx.index, args.weights_dir, args.weights_group)
        self.pp, learner = service_learner(cfg, ctx.index, ctx.task, ctx.verifier, ctx.cache, ctx.exchange,
                                           self.store, lambda s: log.info(s),
                                           shard=_shard_fn(cfg, p) if ranks else None,
                                           device=rank_device(p, 0) if ranks else None)
        self.learner = learner
        state_path = rank_state_path(ctx.state_dir, p.name)
        _check_disk(ctx.state_dir, self.pp, resumed=state_path.is_file())
        evals = eval_log(args.out_dir, p.name)
        pp = self.pp
        self.loop = LearnerLoop(learner,
                                lambda model, step: evaluate(pp, model, ctx.task, ctx.verifier, cfg, evals, step),
                                steps=cfg.budget.steps, eval_every=cfg.eval_every(p.name),
                                checkpoints=Checkpoints(state_path, cfg.checkpoint.every),
                                lockstep=ranks)
        collective = cfg.weights.transport == "collective"  # a broadcast version can be missed, one on disk cannot
        # a version in shared memory does not outlive the learner: a restarted learner's versions are sent again
        self.step = _resume(self.loop, ctx, log, republish=collective or cfg.weights.transport == "shm")
        metrics_path = ctx.state_dir / f"{p.name}.metrics.jsonl"
        _write_missing(metrics_path, self.loop.records)
        self.metrics = LearnerMetrics(p.name, learner.peers, ctx.exchange, rescue=learner.rescue is not None)
        # each learner logs its own policy; the SEE namespace ties the policies of one run together in a tracker
        self.tracker = open_tracker(cfg.tracking, run_info(cfg, p.name, args.namespace, args.out_dir),
                                    warn=log.warning, registry=self.metrics.registry)
        self.ops = OpsServer(self.metrics.registry, self.health, cfg.launcher.host, args.ops_port).start()
        self.metrics_file = metrics_path.open("a")
        self.metrics.position(self.step, learner.version)
        log.info("learning", extra={"fields": {"ops_port": self.ops.port, "start_step": self.step + 1}})
        return self

    def _peer_lag(self) -> int:
        """Steps this learner is ahead of its slowest peer's rollouts (the sources of its incoming edges)."""
        return max((self.step - self.ctx.last_step("rollout", q) for q in self.learner.peers), default=0)

    def health(self) -> dict:
        """What ``/healthz`` answers: the step, the weights version and how far the peers lag."""
        return {"status": "ok", "role": "learner", "policy": self.args.policy, "step": self.step,
                "weights_version": self.learner.version, "lag": max(0, self._peer_lag())}

    def run(self) -> int:
        """Train from the step after the checkpoint to the budget (the final checkpoint once it is done)."""
        ctx, cfg, learner = self.ctx, self.ctx.cfg, self.learner
        peers = learner.peers
        # a rollout service asks again for a missed broadcast, or for a delta whose base it does not serve
        asks_again = cfg.weights.transport == "collective" or isinstance(learner.weights.sender, DeltaSender)
        resend_if_asked = _resender(self) if asks_again else None
        distributor = PromptDistributor(ctx.task.train, cfg.budget.prompts_per_step, seed=cfg.seed)
        for step in range(self.step + 1, cfg.budget.steps + 1):
            if self.stopping.is_set():
                return 0
            problems = distributor.batch(step)
            if cfg.async_.peers == "lockstep":  # peers sample the same step within the deadline, or we go on
                ctx.wait_for(lambda: all(ctx.last_step("rollout", q) >= step for q in peers),
                             cfg.launcher.peer_deadline_s, self.stopping)
            # bounded: never wait; the peer intake takes what is within sharing.max_version_lag of this step
            self._record(step, self.loop.step(step, problems, while_waiting=resend_if_asked))
        _finish(self.args, ctx, self.loop, self.pp, learner, self.ranks, self.log)
        return 0

    def _record(self, step: int, out) -> None:
        """A trained step's durable records to the metrics file and the tracker, its heartbeat, metrics and log."""
        ctx, learner, rec = self.ctx, self.learner, out.record
        if out.durable:
            lines = [r.to_dict() for r in out.durable]
            self.metrics_file.writelines(json.dumps(r) + "\n" for r in lines)
            self.metrics_file.flush()
            for r in lines:
                self.tracker.log(r)
        stages = {k: v for k, v in rec.stage_seconds.items() if k != "wait"}
        if out.checkpoint_s is not None:
            stages["checkpoint"] = out.checkpoint_s
        self.metrics.stages.observe(stages, rec.tokens)
        ctx.exchange.publish(pb.Heartbeat(role="learner", step=step, version=learner.version, status="ok",
                                          stage_seconds=stages, tokens=rec.tokens),
                             f"{ctx.policy_cfg.name}.learner")
        self.step = step
        self.metrics.position(step, learner.version, self._peer_lag())
        self.metrics.observe(rec, learner)
        _log_step(self.log, step, rec)

    def stop(self) -> None:
        """Close what ``start`` opened: the tracker (the final numbers), the ops endpoints, the metrics file, a
        shared-memory sender's slots, the other ranks."""
        try:
            if self.tracker is not None:
                _close_tracker(self.tracker, self.loop, self.step, self.log)
            if self.ops is not None:
                self.ops.stop()
            if self.metrics_file is not None:
                self.metrics_file.close()
            if isinstance(self.store, ShmSender):  # its slots go with it (a killed learner's: the next start reclaims)
                self.store.close()
        finally:
            if self.ranks is not None:
                self.ranks.stop()
                dist.destroy_process_group()


def run_learner_service(args: ServiceArgs) -> int:
    """A policy's learner service, from start to stop (the process's main)."""
    service = LearnerService(args)
    try:
        service.start()
        return service.run()
    finally:
        service.stop()


def _start_ranks(args: ServiceArgs, cfg, p, world: int, log) -> RankGroup:
    """Rank 0 of a sharded learner: start ranks 1..N-1 and join their group."""
    port = free_port()
    log.info("sharded learner", extra={"fields": {"ranks": world, "device": rank_device(p, 0)}})
    group = RankGroup([*rank_argv(args.config, p.name), "--out", str(args.out_dir)], world, port)
    init_group(0, world, port, rank_device(p, 0))
    return group


def _shard_fn(cfg, p):
    on_gpu = p.engine.device.startswith("cuda")
    return lambda model: shard_policy(model, mixed_precision=on_gpu,
                                      activation_checkpointing=p.resources.activation_checkpointing)


def _resender(service: LearnerService):
    """What a learner does between polls for its own rollouts when its rollout service may ask for the weights
    again (a missed broadcast, or a delta whose base it does not serve): send the current weights, whole, as a
    new version (docs/architecture.md, "Weights")."""
    learner, loop = service.learner, service.loop

    def resend_if_asked() -> None:
        if learner.weights.asked_again():
            service.log.info("weights asked for again by the rollout service",
                             extra={"fields": {"version": learner.version + 1}})
            learner.weights.send_whole_next()
            loop.publish(service.step)
            service.metrics.position(service.step, learner.version)

    return resend_if_asked


def _close_tracker(tracker, loop: LearnerLoop, step: int, log) -> None:
    """The policy's final numbers to its trackers, which then close (within tracking.timeout_s)."""
    final = {"steps_done": step, **{k: v for k, v in loop.learner.totals.items() if isinstance(v, int)}}
    evals = [r.eval_accuracy for r in loop.records if r.eval_accuracy is not None]
    if evals:
        final["final_accuracy"] = evals[-1]
    sent = tracker.finish(final)
    if sent:
        log.info("tracking", extra={"fields": {"backends": sent}})


def _log_step(log, step: int, rec: StepRecord) -> None:
    """One line per step, and one warning per peer reputation event."""
    if rec.skipped:
        log.info("step skipped: no own rollouts before the deadline", extra={"fields": {"step": step}})
        return
    for ev in rec.reputation_events:
        log.warning(f"peer {ev['peer']} {ev['action']} at step {rec.step} (failure rate {ev['failure_rate']:.0%})",
                    extra={"fields": {"event": f"peer_{ev['action']}", **ev}})
    log.info("step", extra={"fields": {"step": rec.step, "reward_mean": rec.reward_mean, "loss": rec.loss,
                                       "shared_in": rec.shared_in, "weights_version": rec.weights_version,
                                       "eval_accuracy": rec.eval_accuracy}})


def _finish(args: ServiceArgs, ctx: ServiceContext, loop: LearnerLoop, pp, learner, ranks: RankGroup | None,
            log) -> None:
    """The budget is done: the final checkpoint for users, and the done marker `up` waits for."""
    cfg, p = ctx.cfg, ctx.policy_cfg
    model, opt = loop.finish()
    save_checkpoint(args.out_dir / "checkpoints" / p.name, model, pp.arts.tokenizer, opt,
                    {"step": cfg.budget.steps, "weights_version": learner.version, "policy": p.name,
                     "source": pp.arts.source, "ranks": ranks.world if ranks else 1})
    done = {"step": cfg.budget.steps, "totals": dict(learner.totals)}
    (ctx.state_dir / f"{p.name}.learner.done").write_text(json.dumps(done))
    log.info("budget done")


def _check_disk(state_dir: Path, pp, resumed: bool) -> None:
    """Refuse to start a learner whose disk cannot hold its state files and final checkpoint (two copies of its
    weights and optimiser state at once; one more once resumed): found out at a checkpoint instead, the steps
    since the last one are lost, and a restarted service would fail at the same point again
    (mutualrl.runtime.disk_budget)."""
    p = pp.config
    state = learner_state_bytes(pp.arts.model, moment_bytes(p.optim.state_dtype))
    check_room(state_dir, service_disk_need(state, resumed),
               f"{p.name}'s learner {'state file' if resumed else 'state files'} and final checkpoint (weights and "
               f"optimiser state, {size_text(state)} a copy)", SERVICE_REMEDY)


def _resume(loop: LearnerLoop, ctx: ServiceContext, log, republish: bool) -> int:
    """Restore the checkpoint (if any) and take up where it left off; the last step it covers.

    Weights versions never repeat (rollout servers may serve newer ones than the checkpoint's);
    a collective version is gone once sent, and a shared-memory one with the learner that wrote it, so
    (``republish``) the (re)joined engine gets the checkpointed weights as a new one; the checkpointed
    step is announced again (rollout servers wait on the
    learner's heartbeat); messages received and never acknowledged are taken back."""
    learner, p = loop.learner, ctx.policy_cfg
    done = loop.resume()
    if done:
        learner.weights.continue_after()
        log.info("resumed", extra={"fields": {"step": done, "weights_version": learner.version}})
        if republish:
            loop.publish(done)
        ctx.exchange.publish(pb.Heartbeat(role="learner", step=done, version=learner.version, status="ok"),
                             f"{p.name}.learner")
    adopted = learner.adopt_pending(0)
    if adopted:
        log.info("took back unacknowledged messages", extra={"fields": {"count": adopted}})
    return done
