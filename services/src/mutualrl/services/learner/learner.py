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
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mutualrl.config import AlgorithmConfig, SharingConfig
from mutualrl.config.schema import AsyncConfig, OptimConfig
from mutualrl.models.host import read_scalars
from mutualrl.models.precision import Precision, resolve_precision
from mutualrl.models.sharding import full_state_dict, full_value
from mutualrl.models.sharding import rank as shard_rank
from mutualrl.runtime.memory import return_freed_memory
from mutualrl.runtime.pacing import pace
from mutualrl.see import ExperienceExchange, Received
from mutualrl.services.learner.hinted_rescue import EDGE_COUNTS, HintedRescue, RescueOutcome
from mutualrl.services.learner.micro_batches import LearnerForward, plan_micro_batches
from mutualrl.services.learner.modes import make_mode, record_keys
from mutualrl.services.learner.objective import OWN, PEER, LossInputs, Rows, right_aligned
from mutualrl.services.learner.own_experience import OwnIntake
from mutualrl.services.learner.peer_experience import (
    IntakeResult,
    PeerIntake,
    PeerRefusal,
    dead_letter,
    log_routine_refusals,
)
from mutualrl.services.learner.reputation import PeerReputation, ReputationEvent
from mutualrl.services.learner.success_bank import SuccessBank
from mutualrl.tasks import Problem
from mutualrl.weights import WeightSender
from mutualrl.weights.handshake import WeightsPublisher

log = logging.getLogger("mutualrl.learner")


@dataclass
class StepInputs:
    """What one step's update is made of, once gathered and scored: the rows (own, then peer),
    their advantages and HACPO weights, and the SGT rescues. Plain data, so one rank of a
    sharded learner gathers it and the others receive it."""
    step: int
    rows: Rows
    advantages: torch.Tensor
    omega: torch.Tensor
    rescues: list


@dataclass
class UpdateResult:
    """What one step's optimiser steps report, read back to the host once: per mini-batch losses,
    gradient norms and diagnostics, and how many mini-batches there were and were skipped."""
    losses: list[float]
    grad_norms: list[float]
    per_minibatch: list[dict]
    updates: int
    empty_updates: int


@dataclass
class LearnerSettings:
    """The learner's algorithm settings, taken from the experiment's algorithm and sharing sections."""
    group_size: int
    algorithm: AlgorithmConfig
    sharing: SharingConfig
    optim: OptimConfig
    max_new_tokens: int = 8
    device: str = "cpu"
    peer_deadline_s: float = 30.0  # how long to wait for own experience before training on what arrived
    staleness: AsyncConfig = field(default_factory=AsyncConfig)  # pipelined sampling: the decoupled objective (§6)
    record_edges: bool = False  # a sharing graph: each record has an ``edges`` field
    temperature: float = 1.0  # the engine's sampling temperature: π_θ is computed at it, as π_old was (§1.1)
    no_signal_warn_steps: int = 3  # K: WARNING after K consecutive steps without a mixed-reward own group
    precision: Precision = field(default_factory=lambda: resolve_precision("float32", pretrained=False,
                                                                           device="cpu"))  # model.dtype (§7.1)
    behaviour_correction: bool = False  # the decoupled objective without pipelining: the sampler's numbers differ
    behaviour_gap_bound: float | None = None  # auto: the p99 gap (nats) past which the correction turns on
    gradient_checkpointing: bool = False  # model.gradient_checkpointing


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
        self.sharded = any(hasattr(p, "full_tensor") for p in self.model.parameters())
        if settings.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.forward = LearnerForward(self.model, tokenizer.pad_token_id, settings.temperature,
                                      lambda: settings.precision.context(settings.device))
        self._correct_behaviour = settings.behaviour_correction
        self.tok = tokenizer
        self.ex = exchange
        self.intake = intake
        self.s = settings
        self.ref_model = ref_model
        self.weights = WeightsPublisher(policy, exchange, store, model_config=self.model.config)
        # the size of a whole version never changes: computed once, not on every step (a transport that sends
        # deltas says what its last version took: ``last_bytes``)
        self.weights_bytes = int(sum(t.numel() * t.element_size() for t in model.state_dict().values()))
        # fused: the update of a mini-batch without learning signal is skipped on the device
        # (``found_inf``), so the host never waits for a gradient norm mid-step
        freeze_input_embeddings(self.model, settings.optim.train_input_embeddings)
        self.opt = torch.optim.AdamW([q for q in self.model.parameters() if q.requires_grad], lr=settings.optim.lr,
                                     weight_decay=settings.optim.weight_decay, fused=True)
        self.own = exchange.subscribe(policy, ["rollout"], [policy], consumer=f"{policy}-learner")
        self.context_limit = _context_limit(self.model.config)  # positions the model has (prompt and completion)
        self.own_intake = OwnIntake(policy, self.own, tokenizer, self.context_limit,
                                    self.model.get_input_embeddings().num_embeddings,
                                    max_lag=settings.staleness.max_staleness if settings.staleness.pipelined else None,
                                    group_size=settings.group_size, newest_version=lambda: self.weights.version)
        # what to read from peers, how to use it
        self.mode = make_mode(policy, settings.algorithm, settings.sharing, settings.max_new_tokens)
        self.mode.is_cap = settings.staleness.is_cap
        kinds = list(self.mode.peer_kinds)
        self.peer_sub = exchange.subscribe(policy, kinds, peers,
                                           consumer=f"{policy}-learner") if kinds and peers else None
        self.tracker = self.mode.tracker
        # peers' successes for prompts not trained now, kept for when the prompt comes up (bounded peers)
        self.bank: SuccessBank | None = self.mode.success_bank()
        self._peer_buffer: list[Received] = []
        self._to_ack: list[tuple[object, list[Received]]] = []  # (subscription, messages) awaiting commit()
        self._to_refuse: list[PeerRefusal] = []  # peer messages to dead-letter at commit()
        # message ids the last step trained on, by kind (the service's ledger)
        self.last_used: dict[str, list[str]] = {}
        self.totals: Counter[str] = Counter()
        self.reputation = PeerReputation()
        self.consumed: set[str] = set()  # message ids a durable checkpoint covers: never admitted again
        self.last_edges: dict[str, dict[str, int]] = {}  # the last step's counts per incoming edge (metrics)
        self.reputation_events: list[ReputationEvent] = []  # of the last step (the service logs them)
        self.rescue: HintedRescue | None = None  # SGT-R's rescue round (hinted_rescue.py; setup.py gives it)
        self.last_rescue: RescueOutcome | None = None

    # ---- gathering -------------------------------------------------------
    def adopt_pending(self, min_idle_ms: int = 0) -> int:
        """After a restart: take back the entries this learner received but never acknowledged.
        Those the restored checkpoint already covers (a crash between checkpoint and
        acknowledgement) are acknowledged now and never trained again; the rest are retrained."""
        n = 0
        for sub, buffer in ((self.own, self.own_intake.buffer), (self.peer_sub, self._peer_buffer)):
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
        for refusal in self._to_refuse:
            dead_letter(self.peer_sub, refusal, self.policy)
        self._to_refuse = []

    def state_dict(self) -> dict:
        """Everything a resumed learner needs: model, optimiser, version, tracker, totals and reputation."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "version": self.version,
            "tracker": self.tracker.state_dict() if self.tracker is not None else None,
            "totals": dict(self.totals),
            "reputation": self.reputation.state_dict(),
            "behaviour_correction": self._correct_behaviour,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        if self.tracker is not None and state.get("tracker"):
            self.tracker.load_state_dict(state["tracker"])
        self.totals = Counter(state.get("totals", {}))
        self.reputation.load_state_dict(state.get("reputation") or {})
        self._correct_behaviour = bool(state.get("behaviour_correction", self._correct_behaviour))

    def _collect_peer(self, step: int) -> list[Received]:
        if self.peer_sub is None:
            return []
        got = self._peer_buffer + self._not_consumed(self.peer_sub.poll(), self.peer_sub)
        now = [r for r in got if r.payload.step <= step]
        self._peer_buffer = [r for r in got if r.payload.step > step]
        return now

    # ---- one step --------------------------------------------------------
    def _apply_reputation(self, step: int, intake: IntakeResult) -> None:
        """Score this step's checked claims per peer, then drop everything of a quarantined peer
        (its messages were still checked — that is how it earns its way out — and are
        acknowledged as consumed, counted as ``quarantined``)."""
        self.reputation_events = self.reputation.record_step(step, dict(intake.claims), dict(intake.failures))
        for ev in self.reputation_events:
            self.totals[f"peer_{ev.action}"] += 1
        sources = (set(intake.claims) | {r.source_policy for r in [*intake.rows, *intake.rescues]}
                   | {st.producer for v in intake.stats.values() for st in v})
        bad = {p for p in sources if self.reputation.quarantined(p)}
        if not bad:
            return
        dropped = sum(1 for r in [*intake.rows, *intake.rescues] if r.source_policy in bad)
        intake.rows = [r for r in intake.rows if r.source_policy not in bad]
        intake.rescues = [r for r in intake.rescues if r.source_policy not in bad]
        for pid in list(intake.stats):
            kept = [st for st in intake.stats[pid] if st.producer not in bad]
            dropped += len(intake.stats[pid]) - len(kept)
            if kept:
                intake.stats[pid] = kept
            else:
                del intake.stats[pid]
        for p in bad:
            intake.peer_rewards.pop(p, None)
        if dropped:
            intake.rejected["quarantined"] += dropped

    def _add_peer_rows(self, rows: Rows, intake: IntakeResult, metrics: dict) -> None:
        """Peer rows after own rows, as the mode orders and filters them (HACPO drops
        incomplete groups, counted)."""
        peer_rows, dropped = self.mode.peer_rows(intake.rows)
        if dropped:
            metrics["incomplete_peer_rows"] = dropped
            self.totals["incomplete_peer_rows"] += dropped
        for r in peer_rows:
            rows.add_row(r, kind=PEER)

    def state_bytes(self) -> int:
        """Bytes of what the learner holds between steps: weights and optimiser state (gradients are freed after
        each update) — a policy's share of a run's memory before activations."""
        tensors = [*self.model.parameters(), *(v for st in self.opt.state.values() for v in st.values()
                                               if isinstance(v, torch.Tensor))]
        return int(sum(t.numel() * t.element_size() for t in tensors))

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

    def train_step(self, step: int, problems: list[Problem], commit: bool = True, before_update=None,
                   while_waiting=None) -> dict:
        """One step. With ``commit=False`` the messages it used stay unacknowledged until
        :meth:`commit` (a service commits after checkpointing, for lossless resume).
        ``before_update(inputs)`` is called with the gathered :class:`StepInputs` before the
        optimiser steps (a sharded learner hands them to its other ranks); ``while_waiting()``
        between polls for the step's own rollouts, while the weights are not changing (a service
        sends them again there to a rollout service that missed them)."""
        t0 = time.monotonic()
        expected = len(problems) * self.s.group_size
        by_id = {p.prompt_id: p for p in problems}
        own = self.own_intake.collect(step, expected, t0 + self.s.peer_deadline_s, by_id, self.totals,
                                      lambda got: self._not_consumed(got, self.own), while_waiting)
        t_ready = time.monotonic()
        stages = {"wait": t_ready - t0, "logprob": 0.0, "train": 0.0, "weight_sync": 0.0}
        own = self.own_intake.rescore(own, by_id, self.intake.verifier, self.totals)
        if not own:
            return {"step": step, "policy": self.policy, "skipped": True, "train_s": time.monotonic() - t0}
        own.sort(key=lambda r: (r.payload.prompt_id, r.payload.sample_index))
        metrics: dict = {}

        rows = self.own_intake.rows(own)
        own_successes: dict[str, int] = {}
        for r in own:
            own_successes[r.payload.prompt_id] = own_successes.get(r.payload.prompt_id,
                0) + (1 if r.payload.reward > 0 else 0)

        # ---- peer experience, per the mode's kinds (zero-trust intake) ----
        peer_msgs = self._collect_peer(step)
        intake = IntakeResult()
        by_kind: dict[str, list[Received]] = {}
        for m in peer_msgs:
            by_kind.setdefault(m.kind, []).append(m)
        released = self._peer_successes(by_kind.get("verified_success", []), step, by_id, intake)
        self.intake.rollouts(by_kind.get("rollout", []), step, by_id, intake)
        self.intake.advantage_stats(by_kind.get("advantage_stats", []), step, by_id, intake)
        self._apply_reputation(step, intake)
        if self.s.staleness.pipelined or self.s.staleness.peers == "bounded":
            metrics.update(self._staleness(step, own, intake))
        if self.bank is not None:
            metrics.update(bank_successes=len(self.bank), bank_released=released)
        self._add_peer_rows(rows, intake, metrics)  # none unless the mode reads peer rollouts
        self.mode.observe([float(r.payload.reward) for r in own], intake)  # once per step, before the update (§2.2)

        rescues = self.mode.rescues(rows, intake, own_successes, self.s.group_size)
        gate_open = self.mode.gate_open(own_successes, self.s.group_size)
        if self.rescue is not None:  # SGT-R's second round: the learner's own samples on prompts a peer solved
            self.last_rescue = self.rescue.add_rows(step, rows, own_successes, intake.rescues, by_id)
            metrics.update(self.last_rescue.metrics())

        # ---- advantages once per step, then one update per mini-batch ----
        step_adv = self.mode.advantages(rows, intake.stats)
        metrics.update(step_adv.metrics)
        inputs = StepInputs(step, rows, step_adv.advantages, step_adv.omega, rescues)
        if before_update is not None:
            before_update(inputs)  # a sharded learner's other ranks take the same update (service.py)
        update = self.apply_update(inputs, stages)
        # acknowledge only after the update used them (at-least-once; dedup on redelivery)
        self._to_ack.append((self.own, own))
        if self.peer_sub is not None:  # refused peer messages are dead-lettered instead of acknowledged
            refused = {id(r.message) for r in intake.refusals}
            self._to_ack.append((self.peer_sub, [m for m in intake.used if id(m) not in refused]))
            self._to_refuse += intake.refusals
        log_routine_refusals(self.policy, step, intake.rejected)
        self.last_used = {"own": [r.envelope.message_id for r in own],
                          "peer": [r.envelope.message_id for r in intake.used]}
        if commit:
            self.commit()
        pace("train", self.policy, t_ready)  # benchmarks of the schedule only (MUTUALRL_PACE)
        t_sync = time.monotonic()
        self.publish_weights(step)
        stages["weight_sync"] = time.monotonic() - t_sync
        return self._record(step, rows, own, intake, rescues, gate_open, metrics, update, stages, t0)

    def _peer_successes(self, messages: list[Received], step: int, problems: dict[str, Problem],
                        intake: IntakeResult) -> int:
        """Peers' verified successes into the intake (SGT). With a bank, those for prompts not in this step are
        banked (acknowledged with the step) and banked ones for this step's prompts come out, checked against the
        bank's age bound instead of ``sharing.max_version_lag``; how many came out of the bank."""
        if self.bank is None:
            self.intake.verified_successes(messages, step, problems, intake)
            return 0
        later = [m for m in messages if m.payload.prompt_id not in problems]
        self.bank.deposit(later, step)
        intake.used += later
        self.intake.verified_successes([m for m in messages if m.payload.prompt_id in problems], step, problems,
                                       intake)
        released = self.bank.withdraw(set(problems), step)
        if released:
            self.intake.verified_successes(released, step, problems, intake, max_lag=self.bank.max_age)
            again = {id(m) for m in released}  # acknowledged when banked: not again
            intake.used = [m for m in intake.used if id(m) not in again]
        return len(released)

    def _staleness(self, step: int, own: list[Received], intake: IntakeResult) -> dict:
        """Asynchronous runs' record fields: how many steps behind the learner's weights (those of step t−1) the
        step's own rollouts were sampled, how many the intake refused so far as older than ``async.max_staleness``,
        and the largest step lag of the peer experience admitted (never above ``sharing.max_version_lag``; None
        when none)."""
        lags = [step - 1 - int(r.payload.weights_step) for r in own]
        return {"staleness_mean": sum(lags) / len(lags), "staleness_max": max(lags),
                "own_too_stale": self.totals["own_rejected:too_stale"],
                "peer_step_lag_max": max(intake.step_lags, default=None)}

    @property
    def decoupled(self) -> bool:
        """Whether the decoupled objective runs (§6, §7.1): pipelined sampling, or the sampler computing other
        numbers than the learner (the behaviour correction)."""
        return self.s.staleness.pipelined or self._correct_behaviour

    def _proximal_logprobs(self, rows: Rows, chunks: list[slice], stages: dict) -> list[torch.Tensor | None]:
        """π_prox of the decoupled objective (§6): the log-probs of mini-batches 1.. under the weights the step
        starts with, computed before the first update (no gradient). Mini-batch 0 is trained before any update, so
        its own forward pass gives them (None here); None for every mini-batch when the objective is not
        decoupled."""
        if not self.decoupled:
            return [None] * len(chunks)
        t0 = time.monotonic()
        out: list[torch.Tensor | None] = [None]
        for sl in chunks[1:]:
            prompts, completions = rows.prompt_token_ids[sl], rows.token_ids[sl]
            out.append(self.forward.logprobs_no_grad(prompts, completions, self._plan(prompts, completions)))
        stages["logprob"] += time.monotonic() - t0
        return out

    def logprobs_now(self, prompts: list[list[int]], completions: list[list[int]]) -> torch.Tensor:
        """[b, T] right-aligned log-probs of completions under the current weights, no gradient, micro-batched as
        an update is (SGT-R's information gate and hint-free log-probs)."""
        return self.forward.logprobs_no_grad(prompts, completions, self._plan(prompts, completions))

    def _plan(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[int]]:
        """A mini-batch's forward/backward passes (algorithm.micro_batch_rows / micro_batch_tokens, §7.2)."""
        a = self.s.algorithm
        return plan_micro_batches([len(p) + len(c) for p, c in zip(prompts, completions)], a.micro_batch_rows,
                                  a.micro_batch_tokens)

    def apply_update(self, inputs: StepInputs, stages: dict) -> UpdateResult:
        """The optimiser steps of one step, one per mini-batch, from inputs a single rank gathered:
        every rank of a sharded learner runs exactly this (its collectives must match). Raises
        FloatingPointError (weights untouched by that update) on a non-finite loss or gradient.

        A mini-batch that fits one pass (no micro-batch bound, or few rows) is one forward and backward;
        otherwise its gradient is accumulated over micro-batches through ∂L/∂ℓ (micro_batches.py, §7.2)."""
        step, rows, rescues = inputs.step, inputs.rows, inputs.rescues
        kind_all = torch.tensor(rows.kind)
        src_mean_all = torch.tensor(rows.source_mean_logprob)
        self.model.train()
        o = self.s.optim
        # from the step: a resumed learner agrees
        lr = o.lr * min(1.0, step / o.warmup_steps) if o.warmup_steps else o.lr
        for group in self.opt.param_groups:
            group["lr"] = lr
        t_train = time.monotonic()
        per_mb: list[dict] = []
        # per mini-batch device values, read back to the host once after the last update
        losses: list[torch.Tensor] = []
        grad_norms: list[torch.Tensor] = []
        skipped: list[torch.Tensor] = []
        chunks = self.mode.minibatches(rows, self.s.algorithm.minibatch_rows)
        proximal = self._proximal_logprobs(rows, chunks, stages)
        for m, sl in enumerate(chunks):
            prompts, completions = rows.prompt_token_ids[sl], rows.token_ids[sl]
            plan = self._plan(prompts, completions)
            self.opt.zero_grad(set_to_none=True)
            if len(plan) == 1:
                logp = self.forward.logprobs(prompts, completions)  # [b, T], with its graph
            else:  # pass 1: no graph; the loss's backward stops at this leaf
                logp = self.forward.logprobs_no_grad(prompts, completions, plan).requires_grad_(True)
            x = self._loss_inputs(inputs, sl, m, logp, kind_all, src_mean_all, proximal[m], plan, stages)
            out = self.mode.loss(x)
            loss = out.loss
            mb_metrics = dict(out.metrics)
            if m == 0:
                mb_metrics.update(behaviour_gap(logp.detach(), x.logprobs, x.mask, x.kind == OWN))
            with self.forward.context():
                extra, extra_metrics = self.mode.rescue_loss(self.model, rescues, m, self.tok.pad_token_id)
            if extra is not None:
                loss = loss + extra
                mb_metrics.update(extra_metrics)
            loss.backward()
            if len(plan) > 1:  # pass 2: ∂L/∂ℓ through each micro-batch's graph
                self.forward.backward_through(prompts, completions, plan, logp.grad)
            gn = full_value(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.s.optim.grad_clip))
            # no learning signal (all advantages 0, every row clipped): AdamW would still move the
            # weights by its momentum, which is noise, not learning; a non-finite loss or gradient
            # must not reach the weights either (the step raises below)
            skip = ~(torch.isfinite(loss.detach()) & torch.isfinite(gn) & (gn > 0))
            self.opt.found_inf = skip.to(torch.float32)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)  # no gradients held between updates (while the engine samples)
            losses.append(loss.detach())
            grad_norms.append(gn)
            skipped.append(skip)
            per_mb.append(mb_metrics)
        self.opt.found_inf = None
        return_freed_memory()  # the update's freed activations, back to the host the services share
        # the one host sync
        host = read_scalars({"loss": losses, "grad_norm": grad_norms, "skipped": skipped, "mb": per_mb})
        losses, grad_norms, per_mb = host["loss"], host["grad_norm"], host["mb"]
        empty_updates = int(sum(host["skipped"]))
        bad = [m for m, (v, g) in enumerate(zip(losses, grad_norms)) if not (math.isfinite(v) and math.isfinite(g))]
        if bad:
            m = bad[0]
            raise FloatingPointError(f"{self.policy}: non-finite loss or gradient at step {step} (mini-batch {m}: loss "
                                     f"{losses[m]}, gradient norm {grad_norms[m]}); that update was not applied")
        self._watch_behaviour_gap(per_mb[0] if per_mb else {}, step)
        stages["train"] = time.monotonic() - t_train - stages["logprob"]
        return UpdateResult(losses, grad_norms, per_mb, len(chunks), empty_updates)

    def _loss_inputs(self, inputs: StepInputs, sl: slice, m: int, logp: torch.Tensor, kind_all: torch.Tensor,
                     src_mean_all: torch.Tensor, proximal: torch.Tensor | None, plan: list[list[int]],
                     stages: dict) -> LossInputs:
        """Mini-batch ``m``'s tensors as the mode's loss takes them."""
        rows = inputs.rows
        T, dev = logp.shape[1], logp.device
        ref_logp = None
        if self.s.algorithm.kl_coef > 0 and self.ref_model is not None:
            t_ref = time.monotonic()
            ref_logp = self.forward.logprobs_no_grad(rows.prompt_token_ids[sl], rows.token_ids[sl], plan,
                                                     model=self.ref_model)
            stages["logprob"] += time.monotonic() - t_ref
        return LossInputs(
            logp=logp,
            logprobs=right_aligned(rows.logprobs[sl], T).to(dev),
            mask=right_aligned(rows.mask[sl], T).to(dev),
            advantages=inputs.advantages[sl].to(dev),
            kind=kind_all[sl],  # host: choosing rows never waits for the device
            source_mean_logprob=src_mean_all[sl].to(dev),
            omega=inputs.omega[sl].to(dev),
            minibatch_index=m,
            ref_logp=ref_logp,
            prox_logp=logp.detach() if m == 0 and self.decoupled else proximal,
            token_weight=None if (w := rows.token_weights(sl, T)) is None else w.to(dev),
        )

    def _watch_behaviour_gap(self, first: dict, step: int) -> None:
        """``algorithm.behaviour_correction: auto`` on an exact precision: the first step whose own tokens'
        99th-percentile gap |log π_θ − log π_behaviour| exceeds the bound (§7.1) turns the correction on."""
        gap = first.get("behaviour_gap_p99")
        if (self._correct_behaviour or self.s.behaviour_gap_bound is None or gap is None or not math.isfinite(gap)
                or gap <= self.s.behaviour_gap_bound):
            return
        self._correct_behaviour = True
        log.warning("policy %s: at step %d the sampler's log-probs differ from the learner's by %.3f nats at the "
                    "99th percentile (bound %.3f): the behaviour correction is on from the next step (docs: "
                    "algorithms §7.1)", self.policy, step, gap, self.s.behaviour_gap_bound)

    def _record(self, step: int, rows: Rows, own: list[Received], intake: IntakeResult, rescues: list, gate_open,
                metrics: dict,
                update: UpdateResult, stages: dict, t0: float) -> dict:
        """The step's metrics record (and the running totals)."""
        losses, grad_norms, per_mb = update.losses, update.grad_norms, update.per_minibatch
        for k, v in intake.rejected.items():
            self.totals[f"rejected_{k}"] += v
        peer_used = rows.count(PEER)
        shared_in = self.mode.shared_in(peer_used, rescues, intake.stats) + int(metrics.get("rescue_trained") or 0)
        self.totals["rescues"] += len(rescues)
        self.totals["shared_in"] += shared_in
        for mb in per_mb:  # mean over mini-batches of each diagnostic
            for k, v in mb.items():
                metrics.setdefault("_" + k, []).append(v)
        for k in [k for k in metrics if k.startswith("_")]:
            vals = [v for v in metrics.pop(k) if isinstance(v, (int, float)) and math.isfinite(v)]
            if k.endswith("_rows"):  # counts add up over mini-batches; everything else is a mean
                metrics[k[1:]] = int(sum(vals))
            else:
                metrics[k[1:]] = sum(vals) / len(vals) if vals else None
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
        record = {
            "step": step,
            "policy": self.policy,
            "reward_mean": sum(rows.reward[i] for i in range(len(rows)) if rows.kind[i] == OWN) / len(own),
            "loss": sum(losses) / len(losses),
            "kl": kl_value if kl_value is not None else 0.0,
            "clip_frac": self.mode.clip_fraction(metrics),
            "grad_norm": grad_norm if math.isfinite(grad_norm) else None,
            "updates": update.updates,
            "empty_updates": update.empty_updates,
            "shared_in": shared_in,
            "peer_rows": peer_used,
            "own_rollouts": len(own),
            "peer_candidates": len(intake.rescues) + len(intake.rows) + sum(len(v) for v in intake.stats.values()),
            "peer_rejected": dict(intake.rejected),
            "peer_rescored": intake.rescored,
            "peers_quarantined": sorted(p for p in set(intake.claims) if self.reputation.quarantined(p)),
            "reputation_events": [{"peer": e.peer, "action": e.action,
                                   "failure_rate": round(e.failure_rate, 3)} for e in self.reputation_events],
            "rescue_count": len(rescues),
            "gate_open": gate_open,
            "signal_groups": signal_groups,
            "no_signal_steps": self.totals["no_signal_run"],
            **intake.residual_summary(),
            "weights_version": self.version,
            "ratio_mean": metrics.pop("ratio_mean", None),
            "train_s": time.monotonic() - t0,
            "stage_seconds": stages,
            "weights_bytes": getattr(self.weights.sender, "last_bytes", 0) or self.weights_bytes,
            "learner_state_bytes": self.state_bytes(),
            "tokens": int(sum(len(c) for c in rows.token_ids)),
            **{k: metrics.pop(k, None) for k in record_keys()},  # every mode's fields, None where this mode has none
        }
        for k, v in metrics.items():
            record.setdefault(k, v)
        if self.s.record_edges:
            record["edges"] = self.last_edges
        return record

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


def freeze_input_embeddings(model: torch.nn.Module, train: bool) -> bool:
    """``optim.train_input_embeddings: false``: the input embedding stops taking gradients when the output head
    is a separate matrix (docs/algorithms.md §7.2); with a tied head that would freeze the head too, so it stays
    trained (logged). Whether it froze."""
    if train:
        return False
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is not None and head.weight is emb.weight:
        log.info("optim.train_input_embeddings: false ignored: the output head is tied to the input embedding")
        return False
    emb.weight.requires_grad_(False)
    return True


def behaviour_gap(logp: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor,
                  own: torch.Tensor) -> dict[str, torch.Tensor]:
    """Mean and 99th percentile of |log π_θ − log π_behaviour| over the own rows' tokens before the first update
    (§7.1): zero up to float rounding when sampler and learner compute alike, the size of the bf16 (or another
    engine's) mismatch otherwise. Device scalars, read back with the step's other metrics: no host read here
    (tokens outside the own rows are NaN, so a step without own tokens gives NaN, which the record leaves out)."""
    sel = (mask > 0) & own[:, None].to(mask.device)
    gap = (logp - behaviour).abs().float().masked_fill(~sel, float("nan")).reshape(-1)
    return {"behaviour_gap_mean": gap.nanmean(), "behaviour_gap_p99": torch.nanquantile(gap, 0.99)}


def _signal_groups(rows: Rows) -> int:
    """Own prompt groups whose rewards are not all equal: the only ones that give GRPO's group-relative advantage
    a signal (docs/algorithms.md §1.1). A step with none trains on nothing of its own."""
    by_prompt: dict[str, set[float]] = {}
    for pid, kind, r in zip(rows.prompt_id, rows.kind, rows.reward):
        if kind == OWN:
            by_prompt.setdefault(pid, set()).add(r)
    return sum(1 for rewards in by_prompt.values() if len(rewards) > 1)


def _context_limit(config) -> int:
    """The longest prompt + completion the model takes (its position embeddings)."""
    return int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 1 << 30)
