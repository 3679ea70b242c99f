"""The learner service of one policy: consumes own and peer experience through SEE, steps the
optimiser, publishes weights, and checkpoints so a restart loses nothing and counts nothing twice.

Order per step: train (messages used stay unacknowledged) → every ``checkpoint.every`` steps,
write the checkpoint atomically (model, optimiser, capability tracker, reputation, RNG state,
step, the ledger of message ids every step consumed, and the metrics records since the last
checkpoint) → acknowledge everything those steps used → write their metrics records → announce.

A crash at any instant: before the checkpoint, the steps since the last one are redone from the
messages still pending (taken back at start); between checkpoint and acknowledgement, the
pending messages are found in the ledger, acknowledged and never trained again; records the file
misses are written from the checkpoint. The resumed learner re-announces its checkpointed step
(rollout servers wait on it) and continues weights versions after the newest it announced.
Peers are waited for at most ``launcher.peer_deadline_s``.
"""

from __future__ import annotations

import json
import os
import random
import time

import numpy as np
import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry, Counter, Gauge

from mutualrl.runtime.stage_metrics import StageMetrics

from mutualrl.runtime.distributor import PromptDistributor
from mutualrl.runtime.faults import fault_point
from mutualrl.runtime.http_endpoints import OpsServer
from mutualrl.runtime.outputs import save_checkpoint
from mutualrl.runtime.policy_setup import evaluate
from mutualrl.services.learner.ranks import RankGroup, init_group, learner_world, rank_argv, rank_device
from mutualrl.services.learner.setup import learner_transport, service_learner
from mutualrl.runtime.service_common import AWAITING_WEIGHTS, ServiceArgs, ServiceContext, service_logger, stop_flag
from mutualrl.models.sharding import full_state_dict, shard_policy
from mutualrl.see import SeeCollector
from mutualrl.see.server import free_port
from mutualrl.v1 import experience_pb2 as pb


PEER_REJECTION_REASONS = (
    "stale", "unknown_prompt", "prompt_mismatch", "text_mismatch", "reverify_failed", "quarantined", "malformed", "empty",
    "unknown_tokenizer", "invalid_stats", "duplicate_stats", "thl_unaligned", "thl_roundtrip",
)


def _save_state(path, state: dict, step: int, policy: str = "") -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    fault_point("during_checkpoint", step, path.parent, policy)  # written, not yet in place
    os.replace(tmp, path)  # atomic: a crash leaves the previous checkpoint intact


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
    stop = stop_flag()
    log = service_logger(f"{args.policy}.learner")
    ctx = ServiceContext(args)
    cfg, p = ctx.cfg, ctx.policy_cfg
    if cfg.weights.transport == "collective":
        log.info("hosting the weight group", extra={"fields": {"address": args.weights_group, "engine": p.engine.backend}})
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
    return lambda model: shard_policy(model, mixed_precision=on_gpu, activation_checkpointing=p.resources.activation_checkpointing)


def _serve(args: ServiceArgs, ctx: ServiceContext, log, stop, ranks: RankGroup | None) -> int:
    cfg, p = ctx.cfg, ctx.policy_cfg
    store = learner_transport(cfg, ctx.index, args.weights_dir, args.weights_group)
    pp, learner = service_learner(cfg, ctx.index, ctx.task, ctx.verifier, ctx.cache, ctx.exchange, store, lambda s: log.info(s),
                                  shard=_shard_fn(cfg, p) if ranks else None, device=rank_device(p, 0) if ranks else None)

    def tell(command: str, payload=None) -> None:  # the other ranks of a sharded learner do the same next
        if ranks is not None:
            ranks.send(command, payload)
    peers = [q.name for q in cfg.policies if q.name != p.name]

    state_path = ctx.state_dir / f"{p.name}.learner.state.pt"
    metrics_path = ctx.state_dir / f"{p.name}.metrics.jsonl"
    ledger: dict[int, dict[str, list[str]]] = {}
    records: list[dict] = []  # metrics records of every checkpointed step (replayed into the file on resume)
    start = 1
    if state_path.is_file():
        st = torch.load(state_path, weights_only=False)
        learner.load_state_dict(st["learner"])
        torch.set_rng_state(st["rng"]["torch"])
        random.setstate(st["rng"]["python"])
        np.random.set_state(st["rng"]["numpy"])
        ledger, records = st["ledger"], st.get("records", [])
        start = int(st["step"]) + 1
        learner.consumed = {mid for used in ledger.values() for ids in used.values() for mid in ids}
        newest = ctx.exchange.last("weights_published", p.name)
        if newest is not None and newest.payload.version > learner.version:
            learner.version = int(newest.payload.version)  # versions never repeat: rollout servers may serve newer ones
        log.info("resumed", extra={"fields": {"step": start - 1, "weights_version": learner.version}})
    _write_missing(metrics_path, records)
    tell("resume", start - 1)
    if start > 1 and cfg.weights.transport == "collective":
        # a broadcast version is gone once sent: the (re)joined engine gets the checkpointed weights as a new version
        tell("publish", start - 1)
        learner.publish_weights(start - 1)
    if start > 1:  # re-announce the checkpointed step: rollout servers wait on the learner's heartbeat
        ctx.exchange.publish(pb.Heartbeat(role="learner", step=start - 1, version=learner.version, status="ok"), f"{p.name}.learner")
    adopted = learner.adopt_pending(0)
    if adopted:
        log.info("took back unacknowledged messages", extra={"fields": {"count": adopted}})

    registry = CollectorRegistry()
    g = {
        "step": Gauge("mutualrl_step", "Last step this service finished.", ["policy", "role"], registry=registry),
        "version": Gauge("mutualrl_weights_version", "Weights version published.", ["policy", "role"], registry=registry),
        "thl_unaligned": Gauge("mutualrl_thl_unaligned_ratio", "Mean unaligned-byte fraction of the last step's peer messages, by source policy.", ["policy", "source"], registry=registry),
        "thl_logprob": Gauge("mutualrl_thl_logprob_residual_nats", "Mean |transported - source| sequence log-prob of the last step's peer messages.", ["policy", "source"], registry=registry),
        "thl_length": Gauge("mutualrl_thl_length_ratio", "Mean target/source token-length ratio of the last step's peer messages.", ["policy", "source"], registry=registry),
        "accuracy": Gauge("mutualrl_eval_accuracy_ratio", "Held-out greedy accuracy at the last evaluation.", ["policy"], registry=registry),
        "weights_bytes": Gauge("mutualrl_weights_bytes", "Bytes of the last published weights version.", ["policy"], registry=registry),
        "stale": Gauge("mutualrl_staleness_steps", "Steps the slowest peer is behind this learner.", ["policy", "role"], registry=registry),
        "reward": Gauge("mutualrl_reward_mean", "Mean own reward of the last step.", ["policy"], registry=registry),
    }
    c = {
        "rollouts": Counter("mutualrl_rollouts_consumed", "Own rollouts trained on.", ["policy"], registry=registry),
        "shared_in": Counter("mutualrl_shared_in", "Peer messages used (rows, rescues, stats).", ["policy"], registry=registry),
        "rejected": Counter("mutualrl_peer_rejected", "Peer messages rejected, by reason.", ["policy", "reason"], registry=registry),
        "skipped": Counter("mutualrl_steps_skipped", "Steps with no own rollouts before the deadline.", ["policy"], registry=registry),
        "roundtrip": Counter("mutualrl_thl_roundtrip_failures", "Peer messages whose text did not survive this tokenizer's round trip, by source.", ["policy", "source"], registry=registry),
        "thl_messages": Counter("mutualrl_thl_messages", "Peer messages converted by THL, by source.", ["policy", "source"], registry=registry),
        "rescues": Counter("mutualrl_rescues", "Verified peer successes trained on (SGT rescues).", ["policy"], registry=registry),
        "empty_updates": Counter("mutualrl_empty_updates", "Mini-batches with no gradient signal, on which no optimiser step was taken.", ["policy"], registry=registry),
        "rescored": Counter("mutualrl_peer_rescored", "Peer rows whose claimed reward the receiver's verifier corrected (used with its score).", ["policy"], registry=registry),
        "own_rejected": Counter("mutualrl_own_rejected", "Own rollouts refused before use (unknown prompt, malformed, too long, bad token).", ["policy", "reason"], registry=registry),
        "quarantines": Counter("mutualrl_peer_quarantine_events", "Peers entering or leaving quarantine at this receiver.", ["policy", "peer", "action"], registry=registry),
    }
    g["quarantined"] = Gauge("mutualrl_peer_quarantined", "1 while this receiver ignores the peer's experience (its claims kept failing).", ["policy", "peer"], registry=registry)
    for reason in PEER_REJECTION_REASONS:  # every reason exported from the start, at 0
        c["rejected"].labels(p.name, reason)
    for reason in ("unknown_prompt", "malformed", "too_long", "bad_token"):
        c["own_rejected"].labels(p.name, reason)
    c["rescored"].labels(p.name)
    for q in peers:
        g["quarantined"].labels(p.name, q).set(0)
    c["rescues"].labels(p.name)
    registry.register(SeeCollector(ctx.exchange))
    stage_metrics = StageMetrics(registry, p.name, "learner")
    status = {"step": start - 1}
    reported_own: dict[str, int] = {}  # own rejections already exported, by reason

    def peer_lag() -> int:
        return max((status["step"] - ctx.last_step("rollout", q) for q in peers), default=0)

    def health() -> dict:
        return {"status": "ok", "role": "learner", "policy": p.name, "step": status["step"], "weights_version": learner.version, "lag": max(0, peer_lag())}

    ops = OpsServer(registry, health, cfg.launcher.host, args.ops_port).start()
    distributor = PromptDistributor(ctx.task.train, cfg.budget.prompts_per_step, seed=cfg.seed)
    metrics_file = metrics_path.open("a")
    every = cfg.checkpoint.every
    unsaved: list[dict] = []  # records of the steps since the last checkpoint
    g["step"].labels(p.name, "learner").set(start - 1)
    g["version"].labels(p.name, "learner").set(learner.version)
    log.info("learning", extra={"fields": {"ops_port": ops.port, "start_step": start}})
    collective = cfg.weights.transport == "collective"  # a version sent by broadcast can be missed, one on disk cannot

    def resend_if_asked() -> None:
        """A rollout service that rejoined after a collective version was broadcast asks for the
        weights again (an ``awaiting_weights`` heartbeat) and samples nothing meanwhile; send the
        current weights as a new version, once per request (a request older than the newest
        announcement was answered)."""
        hb = ctx.exchange.last("heartbeat", f"{p.name}.rollout")
        if hb is None or hb.payload.status != AWAITING_WEIGHTS or hb.payload.version >= learner.version:
            return
        wp = ctx.exchange.last("weights_published", p.name)
        if wp is not None and wp.envelope.created_unix_nanos > hb.envelope.created_unix_nanos:
            return
        log.info("weights asked for again by the rollout service", extra={"fields": {"serving": int(hb.payload.version), "version": learner.version + 1}})
        tell("publish", status["step"])
        learner.publish_weights(status["step"])
        g["version"].labels(p.name, "learner").set(learner.version)
    try:
        for step in range(start, cfg.budget.steps + 1):
            if stop.is_set():
                break
            problems = distributor.batch(step)
            # peers finish the same step within the deadline, or we go on without them
            ctx.wait_for(lambda: all(ctx.last_step("rollout", q) >= step for q in peers), cfg.launcher.peer_deadline_s, stop)
            rec = learner.train_step(step, problems, commit=False, before_update=lambda inputs: tell("step", inputs), while_waiting=resend_if_asked if collective else None)
            if not rec.get("skipped") and (step % cfg.eval.every == 0 or step == cfg.budget.steps):
                tell("eval")
                rec["eval_accuracy"] = evaluate(pp, learner.model, ctx.task, ctx.verifier, cfg)
            ledger[step] = learner.last_used if not rec.get("skipped") else {"own": [], "peer": []}
            stages = {k: v for k, v in (rec.get("stage_seconds") or {}).items() if k != "wait"}
            rec["step_s"] = rec.pop("train_s", 0.0)
            rec["wall_time"] = time.time()
            unsaved.append(rec)
            fault_point("before_checkpoint", step, ctx.state_dir, p.name)
            if step % every == 0 or step == cfg.budget.steps:
                rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
                t_ckpt = time.monotonic()
                tell("checkpoint", step)
                _save_state(state_path, {"learner": learner.state_dict(), "step": step, "rng": rng, "ledger": ledger, "records": records + unsaved}, step, p.name)
                stages["checkpoint"] = time.monotonic() - t_ckpt
                fault_point("after_checkpoint", step, ctx.state_dir, p.name)
                learner.commit()  # every message of the steps since the last checkpoint
                fault_point("after_ack", step, ctx.state_dir, p.name)
                records += unsaved
                for r in unsaved:
                    metrics_file.write(json.dumps(r) + "\n")
                metrics_file.flush()
                unsaved = []
            stage_metrics.observe(stages, rec.get("tokens", 0))
            ctx.exchange.publish(pb.Heartbeat(role="learner", step=step, version=learner.version, status="ok",
                                              stage_seconds=stages, tokens=rec.get("tokens", 0)), f"{p.name}.learner")
            status["step"] = step
            g["step"].labels(p.name, "learner").set(step)
            g["version"].labels(p.name, "learner").set(learner.version)
            g["stale"].labels(p.name, "learner").set(max(0, peer_lag()))
            if rec.get("skipped"):
                c["skipped"].labels(p.name).inc()
                log.info("step skipped: no own rollouts before the deadline", extra={"fields": {"step": step}})
                continue
            for src, h in (rec.get("thl_by_source") or {}).items():
                g["thl_unaligned"].labels(p.name, src).set(h["unaligned_mean"])
                g["thl_logprob"].labels(p.name, src).set(h["logprob_residual_mean"])
                g["thl_length"].labels(p.name, src).set(h["length_ratio_mean"])
                c["roundtrip"].labels(p.name, src).inc(h["roundtrip_failures"])
                c["thl_messages"].labels(p.name, src).inc(h["messages"])
            c["rescues"].labels(p.name).inc(rec.get("rescue_count") or 0)
            c["empty_updates"].labels(p.name).inc(rec.get("empty_updates") or 0)
            g["weights_bytes"].labels(p.name).set(rec.get("weights_bytes") or 0)
            if rec.get("eval_accuracy") is not None:
                g["accuracy"].labels(p.name).set(rec["eval_accuracy"])
            g["reward"].labels(p.name).set(rec["reward_mean"])
            c["rollouts"].labels(p.name).inc(len(learner.last_used.get("own", [])))
            c["shared_in"].labels(p.name).inc(rec.get("shared_in", 0))
            for reason, n in (rec.get("peer_rejected") or {}).items():
                c["rejected"].labels(p.name, reason).inc(n)
            c["rescored"].labels(p.name).inc(rec.get("peer_rescored") or 0)
            for key, n in list(learner.totals.items()):
                if key.startswith("own_rejected:"):
                    reason = key.split(":", 1)[1]
                    c["own_rejected"].labels(p.name, reason).inc(n - reported_own.get(reason, 0))
                    reported_own[reason] = n
            for ev in rec.get("reputation_events") or []:
                c["quarantines"].labels(p.name, ev["peer"], ev["action"]).inc()
                g["quarantined"].labels(p.name, ev["peer"]).set(1 if ev["action"] == "quarantined" else 0)
                log.warning(f"peer {ev['peer']} {ev['action']} at step {rec['step']} (failure rate {ev['failure_rate']:.0%})",
                            extra={"fields": {"event": f"peer_{ev['action']}", **ev}})
            log.info("step", extra={"fields": {k: rec.get(k) for k in ("step", "reward_mean", "loss", "shared_in", "weights_version", "eval_accuracy")}})
        else:
            tell("final")
            final_model, final_opt = learner.model, learner.opt
            if ranks is not None:  # the whole model (a collective), into an unsharded copy; the optimiser stays in the rank shards
                final_model = type(learner.model)(learner.model.config)
                final_model.load_state_dict(full_state_dict(learner.model))
                final_opt = None
            save_checkpoint(args.out_dir / "checkpoints" / p.name, final_model, pp.arts.tokenizer, final_opt,
                            {"step": cfg.budget.steps, "weights_version": learner.version, "policy": p.name, "source": pp.arts.source,
                             "ranks": ranks.world if ranks else 1})
            (ctx.state_dir / f"{p.name}.learner.done").write_text(json.dumps({"step": cfg.budget.steps, "totals": dict(learner.totals)}))
            log.info("budget done")
    finally:
        ops.stop()
        metrics_file.close()
    return 0
