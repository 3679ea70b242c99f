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

import torch.distributed as dist

from mutualrl.models.sharding import shard_policy
from mutualrl.runtime.distributor import PromptDistributor
from mutualrl.runtime.http_endpoints import OpsServer
from mutualrl.runtime.outputs import save_checkpoint
from mutualrl.runtime.policy_setup import eval_log, evaluate
from mutualrl.runtime.service_common import ServiceArgs, ServiceContext, service_logger, stop_flag
from mutualrl.see.server import free_port
from mutualrl.services.learner.loop import Checkpoints, LearnerLoop
from mutualrl.services.learner.metrics import LearnerMetrics
from mutualrl.services.learner.ranks import RankGroup, init_group, learner_world, rank_argv, rank_device
from mutualrl.services.learner.setup import learner_transport, service_learner
from mutualrl.tracking import open_tracker
from mutualrl.tracking.identity import run_info
from mutualrl.v1 import experience_pb2 as pb
from mutualrl.weights.deltas import DeltaSender
from mutualrl.weights.shm import ShmSender


def _write_missing(path, records: list[dict]) -> None:
    """Append the checkpoint's records the metrics file lacks (a crash after the checkpoint,
    before they were written), and drop records of steps after it (they are redone)."""
    done = max((r["step"] for r in records), default=0)
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
    kept += [json.dumps(r) for r in records if r["step"] not in have]
    path.write_text("".join(line + "\n" for line in kept))


def run_learner_service(args: ServiceArgs) -> int:
    """A policy's learner service: trains step by step, publishes weights, checkpoints, and serves /healthz and
    /metrics."""
    stop = stop_flag()
    log = service_logger(f"{args.policy}.learner")
    ctx = ServiceContext(args)
    cfg, p = ctx.cfg, ctx.policy_cfg
    if cfg.weights.transport == "collective":
        log.info("hosting the weight group",
                 extra={"fields": {"address": args.weights_group, "engine": p.engine.backend}})
    world = learner_world(p)
    ranks = _start_ranks(args, cfg, p, world, log) if world > 1 else None
    try:
        return _serve(args, ctx, log, stop, ranks)
    finally:
        if ranks is not None:
            ranks.stop()
            dist.destroy_process_group()


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


def _resender(loop: LearnerLoop, metrics: LearnerMetrics, status: dict, log):
    """What a learner does between polls for its own rollouts when its rollout service may ask for the weights
    again (a missed broadcast, or a delta whose base it does not serve): send the current weights, whole, as a
    new version (docs/architecture.md, "Weights")."""
    learner = loop.learner

    def resend_if_asked() -> None:
        if learner.weights.asked_again():
            log.info("weights asked for again by the rollout service",
                     extra={"fields": {"version": learner.version + 1}})
            learner.weights.send_whole_next()
            loop.publish(status["step"])
            metrics.position(status["step"], learner.version)

    return resend_if_asked


def _serve(args: ServiceArgs, ctx: ServiceContext, log, stop, ranks: RankGroup | None) -> int:
    cfg, p = ctx.cfg, ctx.policy_cfg
    store = learner_transport(cfg, ctx.index, args.weights_dir, args.weights_group)
    pp, learner = service_learner(cfg, ctx.index, ctx.task, ctx.verifier, ctx.cache, ctx.exchange, store,
                                  lambda s: log.info(s),
                                  shard=_shard_fn(cfg, p) if ranks else None,
                                  device=rank_device(p, 0) if ranks else None)
    evals = eval_log(args.out_dir, p.name)
    loop = LearnerLoop(learner, lambda model, step: evaluate(pp, model, ctx.task, ctx.verifier, cfg, evals, step),
                       steps=cfg.budget.steps,
                       eval_every=cfg.eval_every(p.name),
                       checkpoints=Checkpoints(ctx.state_dir / f"{p.name}.learner.state.pt", cfg.checkpoint.every),
                       lockstep=ranks)
    peers = learner.peers  # the sources of its incoming sharing edges (every other policy without edges)
    collective = cfg.weights.transport == "collective"  # a version sent by broadcast can be missed, one on disk cannot
    # a rollout service asks again for a missed broadcast, or for a delta whose base it does not serve
    asks_again = collective or isinstance(learner.weights.sender, DeltaSender)
    # a version in shared memory does not outlive the learner: a restarted learner's versions are sent again
    done = _resume(loop, ctx, log, republish=collective or cfg.weights.transport == "shm")
    metrics_path = ctx.state_dir / f"{p.name}.metrics.jsonl"
    _write_missing(metrics_path, loop.records)

    metrics = LearnerMetrics(p.name, peers, ctx.exchange, rescue=learner.rescue is not None)
    status = {"step": done}

    def peer_lag() -> int:
        return max((status["step"] - ctx.last_step("rollout", q) for q in peers), default=0)

    def health() -> dict:
        return {"status": "ok", "role": "learner", "policy": p.name, "step": status["step"],
                "weights_version": learner.version, "lag": max(0, peer_lag())}

    # each learner logs its own policy; the SEE namespace ties the policies of one run together in a tracker
    tracker = open_tracker(cfg.tracking, run_info(cfg, p.name, args.namespace, args.out_dir),
                           warn=log.warning, registry=metrics.registry)
    ops = OpsServer(metrics.registry, health, cfg.launcher.host, args.ops_port).start()
    distributor = PromptDistributor(ctx.task.train, cfg.budget.prompts_per_step, seed=cfg.seed)
    metrics_file = metrics_path.open("a")
    metrics.position(done, learner.version)
    log.info("learning", extra={"fields": {"ops_port": ops.port, "start_step": done + 1}})

    resend_if_asked = _resender(loop, metrics, status, log) if asks_again else None
    try:
        for step in range(done + 1, cfg.budget.steps + 1):
            if stop.is_set():
                break
            problems = distributor.batch(step)
            if cfg.async_.peers == "lockstep":  # peers sample the same step within the deadline, or we go on
                ctx.wait_for(lambda: all(ctx.last_step("rollout", q) >= step for q in peers),
                             cfg.launcher.peer_deadline_s, stop)
            # bounded: never wait; the peer intake takes what is within sharing.max_version_lag of this step
            out = loop.step(step, problems, while_waiting=resend_if_asked)
            rec = out.record
            if out.durable:
                metrics_file.writelines(json.dumps(r) + "\n" for r in out.durable)
                metrics_file.flush()
                for r in out.durable:
                    tracker.log(r)
            stages = {k: v for k, v in (rec.get("stage_seconds") or {}).items() if k != "wait"}
            if out.checkpoint_s is not None:
                stages["checkpoint"] = out.checkpoint_s
            metrics.stages.observe(stages, rec.get("tokens", 0))
            ctx.exchange.publish(pb.Heartbeat(role="learner", step=step, version=learner.version, status="ok",
                                              stage_seconds=stages, tokens=rec.get("tokens", 0)), f"{p.name}.learner")
            status["step"] = step
            metrics.position(step, learner.version, peer_lag())
            metrics.observe(rec, learner)
            _log_step(log, step, rec)
        else:
            _finish(args, ctx, loop, pp, learner, ranks, log)
    finally:
        _close_tracker(tracker, loop, status["step"], log)
        ops.stop()
        metrics_file.close()
        if isinstance(store, ShmSender):  # its slots go with it (a killed learner's: the next start reclaims them)
            store.close()
    return 0


def _close_tracker(tracker, loop: LearnerLoop, step: int, log) -> None:
    """The policy's final numbers to its trackers, which then close (within tracking.timeout_s)."""
    final = {"steps_done": step, **{k: v for k, v in loop.learner.totals.items() if isinstance(v, int)}}
    evals = [r["eval_accuracy"] for r in loop.records if r.get("eval_accuracy") is not None]
    if evals:
        final["final_accuracy"] = evals[-1]
    sent = tracker.finish(final)
    if sent:
        log.info("tracking", extra={"fields": {"backends": sent}})


def _log_step(log, step: int, rec: dict) -> None:
    """One line per step, and one warning per peer reputation event."""
    if rec.get("skipped"):
        log.info("step skipped: no own rollouts before the deadline", extra={"fields": {"step": step}})
        return
    for ev in rec.get("reputation_events") or []:
        log.warning(f"peer {ev['peer']} {ev['action']} at step {rec['step']} (failure rate {ev['failure_rate']:.0%})",
                    extra={"fields": {"event": f"peer_{ev['action']}", **ev}})
    fields = ("step", "reward_mean", "loss", "shared_in", "weights_version", "eval_accuracy")
    log.info("step", extra={"fields": {k: rec.get(k) for k in fields}})


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
