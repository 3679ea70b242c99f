"""The learner: one training step from own rollouts (+ peer experience, per the sharing mode).

Algorithm-blind plumbing: the objective comes from ``mutualrl.grpo``; this
module gathers inputs from SEE, runs the model, steps the optimiser and
publishes the new weights version (write, then announce).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mutualrl.models.policy import context_limit, enable_activation_checkpointing
from mutualrl.models.sharding import full_state_dict, is_sharded
from mutualrl.models.sharding import rank as shard_rank
from mutualrl.runtime.memory import StagePeaks, return_freed_memory
from mutualrl.runtime.pacing import pace
from mutualrl.see import ExperienceExchange, Received
from mutualrl.services.learner.hinted_rescue import EDGE_COUNTS, HintedRescue, RescueOutcome
from mutualrl.services.learner.modes import make_mode, record_keys
from mutualrl.services.learner.objective import OWN, PEER, Rows
from mutualrl.services.learner.own_experience import OwnIntake
from mutualrl.services.learner.peer_experience import (
    IntakeResult,
    PeerIntake,
    log_routine_refusals,
)
from mutualrl.services.learner.peer_gathering import PeerGathering
from mutualrl.services.learner.settings import LearnerSettings
from mutualrl.services.learner.step_record import STEP_FIELDS, StepRecord
from mutualrl.services.learner.update import PolicyUpdate, StepInputs, UpdateResult
from mutualrl.tasks import Problem
from mutualrl.weights import WeightSender
from mutualrl.weights.handshake import WeightsPublisher

log = logging.getLogger("mutualrl.learner")


class Learner:
    """One policy's trainer: turns its rollouts and admitted peer experience into optimiser steps."""
    def __init__(
        self,
        policy: str,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        exchange: ExperienceExchange,
        intake: PeerIntake,
        store: WeightSender,
        settings: LearnerSettings,
        peers: list[str],
        ref_model: PreTrainedModel | None = None,
    ):
        self.policy = policy
        self.peers = list(peers)
        self.model = model.to(settings.device)
        # FSDP2 (mutualrl.models.sharding)
        self.sharded = is_sharded(self.model)
        if settings.gradient_checkpointing:
            enable_activation_checkpointing(self.model)
        self.tok = tokenizer
        self.ex = exchange
        self.intake = intake
        self.s = settings
        self.weights = WeightsPublisher(policy, exchange, store, model_config=self.model.config)
        # the size of a whole version never changes: computed once, not on every step (a transport that sends
        # deltas says what its last version took: ``last_bytes``)
        self.weights_bytes = int(sum(t.numel() * t.element_size() for t in model.state_dict().values()))
        self.own = exchange.subscribe(policy, ["rollout"], [policy], consumer=f"{policy}-learner")
        self.context_limit = context_limit(self.model.config) or 1 << 30  # positions (prompt and completion)
        self.own_intake = OwnIntake(policy, self.own, tokenizer, self.context_limit,
                                    self.model.get_input_embeddings().num_embeddings,
                                    max_lag=settings.staleness.max_staleness if settings.staleness.pipelined else None,
                                    group_size=settings.group_size, newest_version=lambda: self.weights.version)
        # what to read from peers, how to use it
        self.mode = make_mode(policy, settings.algorithm, settings.sharing, settings.max_new_tokens)
        self.mode.is_cap = settings.staleness.is_cap
        self.updater = PolicyUpdate(policy, self.model, tokenizer.pad_token_id, settings, self.mode, ref_model)
        self.peer_in = PeerGathering(policy, exchange, self.peers, list(self.mode.peer_kinds), intake,
                                     self.mode.success_bank(), self._not_consumed)
        self.tracker = self.mode.tracker
        self._to_ack: list[tuple[object, list[Received]]] = []  # (subscription, messages) awaiting commit()
        # message ids the last step trained on, by kind (the service's ledger)
        self.last_used: dict[str, list[str]] = {}
        self.totals: Counter[str] = Counter()
        self.consumed: set[str] = set()  # message ids a durable checkpoint covers: never admitted again
        self.last_edges: dict[str, dict[str, int]] = {}  # the last step's counts per incoming edge (metrics)
        self.rescue: HintedRescue | None = None  # SGT-R's rescue round (hinted_rescue.py; setup.py gives it)
        self.last_rescue: RescueOutcome | None = None

    @property
    def peer_sub(self):
        """The subscription to the peers' streams (None when the mode reads nothing from peers)."""
        return self.peer_in.sub

    # ---- gathering -------------------------------------------------------
    def adopt_pending(self, min_idle_ms: int = 0) -> int:
        """After a restart: take back the entries this learner received but never acknowledged.
        Those the restored checkpoint already covers (a crash between checkpoint and
        acknowledgement) are acknowledged now and never trained again; the rest are retrained."""
        n = 0
        for sub, buffer in ((self.own, self.own_intake.buffer), (self.peer_in.sub, self.peer_in.buffer)):
            if sub is None:
                continue
            got = sub.reclaim(min_idle_ms)
            covered = [r for r in got if r.envelope.message_id in self.consumed]
            if covered:
                sub.ack(covered)
                self.totals["covered_by_checkpoint"] += len(covered)
            fresh = [r for r in got if r.envelope.message_id not in self.consumed]
            buffer += fresh
            n += len(fresh)
        return n

    def _not_consumed(self, got: list[Received], sub) -> list[Received]:
        """Drop (and acknowledge) re-deliveries of messages a checkpoint already covers."""
        if not self.consumed:
            return got
        old = [r for r in got if r.envelope.message_id in self.consumed]
        if old:
            sub.ack(old)
            self.totals["covered_by_checkpoint"] += len(old)
        return [r for r in got if r.envelope.message_id not in self.consumed]

    def commit(self) -> None:
        """Acknowledge what the steps since the last commit used (call once their checkpoint is durable)."""
        for sub, msgs in self._to_ack:
            sub.ack(msgs)  # type: ignore[attr-defined]
        self._to_ack = []
        self.peer_in.commit()

    def state_dict(self) -> dict:
        """Everything a resumed learner needs: model, optimiser, version, tracker, totals and reputation."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.updater.opt.state_dict(),
            "version": self.version,
            "tracker": self.tracker.state_dict() if self.tracker is not None else None,
            "totals": dict(self.totals),
            "reputation": self.peer_in.reputation.state_dict(),
            "behaviour_correction": self.updater.correct_behaviour,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.model.load_state_dict(state["model"])
        self.updater.opt.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        if self.tracker is not None and state.get("tracker"):
            self.tracker.load_state_dict(state["tracker"])
        self.totals = Counter(state.get("totals", {}))
        self.peer_in.reputation.load_state_dict(state.get("reputation") or {})
        self.updater.correct_behaviour = bool(state.get("behaviour_correction", self.updater.correct_behaviour))

    @property
    def version(self) -> int:
        """The newest weights version published (every rank of a sharded learner counts alike)."""
        return self.weights.version

    @version.setter
    def version(self, value: int) -> None:
        self.weights.version = value

    def publish_weights(self, step: int) -> None:
        """Publish the current weights as the next version (a collective on a sharded learner:
        every rank gathers, rank 0 publishes through :class:`~mutualrl.weights.handshake.WeightsPublisher`)."""
        weights = full_state_dict(self.model) if self.sharded else self.model.state_dict()
        if shard_rank() != 0:
            self.weights.version += 1
            return
        self.weights.publish(step, weights)
        # a delta sender's previous base (a copy of the weights) back to the host (where it shares one)
        return_freed_memory(default=self.s.return_freed_memory, free_below=self.s.trim_when_free_below)

    def train_step(self, step: int, problems: list[Problem], commit: bool = True, before_update=None,
                   while_waiting=None) -> StepRecord:
        """One step. With ``commit=False`` the messages it used stay unacknowledged until
        :meth:`commit` (a service commits after checkpointing, for lossless resume).
        ``before_update(inputs)`` is called with the gathered :class:`StepInputs` before the
        optimiser steps (a sharded learner hands them to its other ranks); ``while_waiting()``
        between polls for the step's own rollouts, while the weights are not changing (a service
        sends them again there to a rollout service that missed them)."""
        t0 = time.monotonic()
        peaks = StagePeaks()  # the process's peak resident memory per stage (record field stage_peak_rss_gib)
        peaks.enter("intake")
        expected = len(problems) * self.s.group_size
        by_id = {p.prompt_id: p for p in problems}
        own = self.own_intake.collect(step, expected, t0 + self.s.peer_deadline_s, by_id, self.totals,
                                      lambda got: self._not_consumed(got, self.own), while_waiting)
        t_ready = time.monotonic()
        stages = {"wait": t_ready - t0, "logprob": 0.0, "train": 0.0, "weight_sync": 0.0}
        own = self.own_intake.rescore(own, by_id, self.intake.verifier, self.totals)
        if not own:
            return StepRecord(step, self.policy, skipped=True, train_s=time.monotonic() - t0)
        own.sort(key=lambda r: (r.payload.prompt_id, r.payload.sample_index))
        metrics: dict = {}

        rows = self.own_intake.rows(own)
        metrics["own_sampled_nll"] = rows.own_sampled_nll()  # the sampling entropy's estimate (style collapse)
        own_successes: dict[str, int] = {}
        for r in own:
            own_successes[r.payload.prompt_id] = own_successes.get(r.payload.prompt_id,
                0) + (1 if r.payload.reward > 0 else 0)

        # ---- peer experience, per the mode's kinds (zero-trust intake) ----
        intake, released = self.peer_in.gather(step, by_id)
        for ev in self.peer_in.events:
            self.totals[f"peer_{ev.action}"] += 1
        if self.s.staleness.pipelined or self.s.staleness.peers == "bounded":
            metrics.update(self._staleness(step, own, intake))
        if self.peer_in.bank is not None:
            metrics.update(bank_successes=len(self.peer_in.bank), bank_released=released)
        # peer rows after own rows (none unless the mode reads peer rollouts), rewards observed, rescues, gate
        sharing = self.mode.begin_step(rows, intake, [float(r.payload.reward) for r in own], own_successes,
                                       self.s.group_size)
        if sharing.dropped_peer_rows:  # HACPO drops incomplete groups, counted
            metrics["incomplete_peer_rows"] = sharing.dropped_peer_rows
            self.totals["incomplete_peer_rows"] += sharing.dropped_peer_rows
        rescues, gate_open = sharing.rescues, sharing.gate_open
        if self.rescue is not None:  # SGT-R's second round: the learner's own samples on prompts a peer solved
            self.last_rescue = self.rescue.add_rows(step, rows, own_successes, intake.rescues, by_id)
            metrics.update(self.last_rescue.metrics())

        # ---- advantages once per step, then one update per mini-batch ----
        step_adv = self.mode.advantages(rows, intake.stats)
        metrics.update(step_adv.metrics)
        inputs = StepInputs(step, rows, step_adv.advantages, step_adv.omega, rescues)
        if before_update is not None:
            before_update(inputs)  # a sharded learner's other ranks take the same update (service.py)
        peaks.enter("train")
        update = self.updater.apply(inputs, stages)
        # acknowledge only after the update used them (at-least-once; dedup on redelivery)
        self._to_ack.append((self.own, own))
        if self.peer_in.sub is not None:  # refused peer messages are dead-lettered instead of acknowledged
            self._to_ack.append((self.peer_in.sub, self.peer_in.settle(intake)))
        log_routine_refusals(self.policy, step, intake.rejected)
        self.last_used = {"own": [r.envelope.message_id for r in own],
                          "peer": [r.envelope.message_id for r in intake.used]}
        if commit:
            self.commit()
        pace("train", self.policy, t_ready)  # benchmarks of the schedule only (MUTUALRL_PACE)
        t_sync = time.monotonic()
        peaks.enter("weight_sync")
        self.publish_weights(step)
        stages["weight_sync"] = time.monotonic() - t_sync
        peaks.enter(None)
        if peaks.peaks:
            metrics["stage_peak_rss_gib"] = peaks.peaks
        return self._record(step, rows, own, intake, rescues, gate_open, metrics, update, stages, t0)

    def _staleness(self, step: int, own: list[Received], intake: IntakeResult) -> dict:
        """Asynchronous runs' record fields: how many steps behind the learner's weights (those of step t−1) the
        step's own rollouts were sampled, how many the intake refused so far as older than ``async.max_staleness``,
        and the largest step lag of the peer experience admitted (never above ``sharing.max_version_lag``; None
        when none)."""
        lags = [step - 1 - int(r.payload.weights_step) for r in own]
        return {"staleness_mean": sum(lags) / len(lags), "staleness_max": max(lags),
                "own_too_stale": self.totals["own_rejected:too_stale"],
                "peer_step_lag_max": max(intake.step_lags, default=None)}

    def _record(self, step: int, rows: Rows, own: list[Received], intake: IntakeResult, rescues: list, gate_open,
                metrics: dict,
                update: UpdateResult, stages: dict, t0: float) -> StepRecord:
        """The step's metrics record (and the running totals)."""
        losses, grad_norms, per_mb = update.losses, update.grad_norms, update.per_minibatch
        for k, v in intake.rejected.items():
            self.totals[f"rejected_{k}"] += v
        peer_used = rows.count(PEER)
        rescued = int(metrics.get("rescue_trained") or 0)  # SGT-R's own rescue samples trained
        for mb in per_mb:  # mean over mini-batches of each diagnostic
            for k, v in mb.items():
                metrics.setdefault("_" + k, []).append(v)
        for k in [k for k in metrics if k.startswith("_")]:
            vals = [v for v in metrics.pop(k) if isinstance(v, (int, float)) and math.isfinite(v)]
            if k.endswith("_rows"):  # counts add up over mini-batches; everything else is a mean
                metrics[k[1:]] = int(sum(vals))
            else:
                metrics[k[1:]] = sum(vals) / len(vals) if vals else None
        shared_in, clip_frac = self.mode.report(metrics, peer_used, rescues, intake.stats)
        shared_in += rescued
        self.totals["rescues"] += len(rescues)
        self.totals["shared_in"] += shared_in
        kl_value = metrics.get("kl") if metrics.get("kl") is not None else metrics.get("approx_kl")
        grad_norm = sum(grad_norms) / len(grad_norms)
        self.last_edges = self._edge_counts(rows, intake, rescues)
        signal_groups = _signal_groups(rows)
        self.totals["no_signal_run"] = 0 if signal_groups else self.totals["no_signal_run"] + 1
        run = self.totals["no_signal_run"]
        if run and run % self.s.no_signal_warn_steps == 0:
            log.warning("policy %s: every own group had equal rewards for %d steps in a row (step %d, reward mean "
                        "%.2f): GRPO has no signal; check the answer format and prompt style (mutualrl probe)",
                        self.policy, run, step, sum(rows.reward[i] for i in range(len(rows)) if rows.kind[i] == OWN)
                        / max(1, len(own)))
        return StepRecord(
            step=step,
            policy=self.policy,
            reward_mean=sum(rows.reward[i] for i in range(len(rows)) if rows.kind[i] == OWN) / len(own),
            loss=sum(losses) / len(losses),
            kl=kl_value if kl_value is not None else 0.0,
            clip_frac=clip_frac,
            grad_norm=grad_norm if math.isfinite(grad_norm) else None,
            updates=update.updates,
            empty_updates=update.empty_updates,
            shared_in=shared_in,
            peer_rows=peer_used,
            own_rollouts=len(own),
            peer_candidates=len(intake.rescues) + len(intake.rows) + sum(len(v) for v in intake.stats.values()),
            peer_rejected=dict(intake.rejected),
            peer_rescored=intake.rescored,
            peers_quarantined=sorted(p for p in set(intake.claims) if self.peer_in.reputation.quarantined(p)),
            reputation_events=[{"peer": e.peer, "action": e.action,
                                "failure_rate": round(e.failure_rate, 3)} for e in self.peer_in.events],
            rescue_count=len(rescues),
            gate_open=gate_open,
            signal_groups=signal_groups,
            no_signal_steps=self.totals["no_signal_run"],
            **intake.residual_summary(),
            weights_version=self.version,
            ratio_mean=metrics.pop("ratio_mean", None),
            stage_seconds=stages,
            weights_bytes=getattr(self.weights.sender, "last_bytes", 0) or self.weights_bytes,
            learner_state_bytes=self.updater.state_bytes(),
            tokens=int(sum(len(c) for c in rows.token_ids)),
            # every mode's fields (None where this mode has none), then the step's diagnostics
            extra={**{k: metrics.pop(k, None) for k in record_keys()},
                   **{k: v for k, v in metrics.items() if k not in STEP_FIELDS}},
            edges=self.last_edges if self.s.record_edges else None,
            train_s=time.monotonic() - t0,
        )

    def _edge_counts(self, rows: Rows, intake: IntakeResult, rescues: list) -> dict[str, dict[str, int]]:
        """Per incoming sharing edge (keyed ``source->receiver``): messages offered, rows and stats used, messages
        refused as stale or by THL, rescues."""
        used = Counter(src for src, kind in zip(rows.source_policy, rows.kind) if kind == PEER)
        used.update(st.producer for stats in intake.stats.values() for st in stats)
        rescued = Counter(r.source_policy for r in rescues)
        out = {}
        for src in self.peers:
            c = intake.per_source.get(src, Counter())
            out[f"{src}->{self.policy}"] = {"offered": c["offered"], "used": used[src], "stale": c["stale"],
                                            "thl_rejected": c["thl_rejected"], "rescues": rescued[src]}
            if self.rescue is not None:  # SGT-R's hints and rescue samples on this edge
                got = self.last_rescue.per_source.get(src, Counter()) if self.last_rescue else Counter()
                out[f"{src}->{self.policy}"].update({k: got[k] for k in EDGE_COUNTS})
        return out


def _signal_groups(rows: Rows) -> int:
    """Own prompt groups whose rewards are not all equal: the only ones that give GRPO's group-relative advantage
    a signal (docs/algorithms.md §1.1). A step with none trains on nothing of its own."""
    by_prompt: dict[str, set[float]] = {}
    for pid, kind, r in zip(rows.prompt_id, rows.kind, rows.reward):
        if kind == OWN:
            by_prompt.setdefault(pid, set()).add(r)
    return sum(1 for rewards in by_prompt.values() if len(rewards) > 1)

