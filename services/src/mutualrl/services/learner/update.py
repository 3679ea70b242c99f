"""The optimiser side of a learner: one step's updates from gathered inputs (one per mini-batch, micro-batched
passes), the decoupled objective's proximal log-probs, the sampler/learner gap watch. Every rank of a sharded learner
runs exactly this on the inputs one rank gathered (its collectives must match)."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from mutualrl.models.host import read_scalars
from mutualrl.models.optimizer import make_optimizer
from mutualrl.models.sharding import full_value, is_sharded
from mutualrl.runtime.memory import return_freed_memory
from mutualrl.services.learner.micro_batches import LearnerForward, plan_micro_batches
from mutualrl.services.learner.modes.base import SharingMode
from mutualrl.services.learner.objective import OWN, LossInputs, Rows, right_aligned
from mutualrl.services.learner.settings import LearnerSettings

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


class PolicyUpdate:
    """A policy's model, optimiser and forward passes, and the updates of a step. ``mode`` gives the loss (and
    SGT's rescue loss) and the mini-batches; the settings give the optimiser, the temperature π_θ is computed at
    and the precision."""

    def __init__(self, policy: str, model: PreTrainedModel, pad_id: int, settings: LearnerSettings,
                 mode: SharingMode, ref_model: PreTrainedModel | None = None):
        self.policy = policy
        self.model = model
        self.pad_id = pad_id
        self.s = settings
        self.mode = mode
        self.ref_model = ref_model
        # bf16-mixed: weight casts are cast again for the backward rather than held (§7.2) — not under FSDP2, which
        # gathers a block's weights again before its backward (the same values in a new version of the tensor)
        context = settings.precision.context if is_sharded(model) else settings.precision.learner_context
        self.forward = LearnerForward(model, pad_id, settings.temperature, lambda: context(settings.device),
                                      # FSDP2 gathers a block's weights once per forward: one forward per pass
                                      share_prompts=settings.algorithm.share_prompt_forward and not is_sharded(model))
        self.correct_behaviour = settings.behaviour_correction
        freeze_input_embeddings(model, settings.optim.train_input_embeddings)
        self.opt = make_optimizer([q for q in model.parameters() if q.requires_grad], lr=settings.optim.lr,
                                  weight_decay=settings.optim.weight_decay, state_dtype=settings.optim.state_dtype)

    @property
    def decoupled(self) -> bool:
        """Whether the decoupled objective runs (§6, §7.1): pipelined sampling, or the sampler computing other
        numbers than the learner (the behaviour correction)."""
        return self.s.staleness.pipelined or self.correct_behaviour

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
            out.append(self.forward.logprobs_no_grad(prompts, completions, self.plan(prompts, completions)))
        stages["logprob"] += time.monotonic() - t0
        return out

    def logprobs_now(self, prompts: list[list[int]], completions: list[list[int]]) -> torch.Tensor:
        """[b, T] right-aligned log-probs of completions under the current weights, no gradient, micro-batched as
        an update is (SGT-R's information gate and hint-free log-probs)."""
        return self.forward.logprobs_no_grad(prompts, completions, self.plan(prompts, completions))

    def plan(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[int]]:
        """A mini-batch's forward/backward passes (algorithm.micro_batch_rows / micro_batch_tokens, §7.2)."""
        a = self.s.algorithm
        return plan_micro_batches([len(p) + len(c) for p, c in zip(prompts, completions)], a.micro_batch_rows,
                                  a.micro_batch_tokens)

    def apply(self, inputs: StepInputs, stages: dict) -> UpdateResult:
        """The optimiser steps of one step, one per mini-batch, from inputs a single rank gathered:
        every rank of a sharded learner runs exactly this (its collectives must match). Raises
        FloatingPointError (weights untouched by that update) on a non-finite loss or gradient.

        A mini-batch that fits one pass (no micro-batch bound, or few rows) is one forward and backward;
        otherwise its gradient is accumulated over micro-batches through ∂L/∂ℓ (``_accumulate``, §7.2)."""
        step, rows = inputs.step, inputs.rows
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
            self.opt.zero_grad(set_to_none=True)
            loss, logp, x, mb_metrics = self._accumulate(inputs, sl, m, kind_all, src_mean_all, proximal[m], stages)
            if m == 0:
                mb_metrics.update(behaviour_gap(logp.detach(), x.logprobs, x.mask, x.kind == OWN))
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
        # the update's freed activations, back to the host the services share (not where one process runs them all)
        return_freed_memory(default=self.s.return_freed_memory, free_below=self.s.trim_when_free_below)
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

    def _accumulate(self, inputs: StepInputs, sl: slice, m: int, kind_all: torch.Tensor, src_mean_all: torch.Tensor,
                    proximal: torch.Tensor | None, stages: dict) -> tuple[torch.Tensor, torch.Tensor, LossInputs, dict]:
        """Mini-batch ``m``'s gradient into the parameters (§7.2): one forward and backward when it fits one pass;
        else one pass per micro-batch when the mode's loss is row-local, two passes through ∂L/∂ℓ when it is not.
        Returns the loss (detached in the micro-batched paths), the log-probs, the loss inputs and the metrics."""
        rows, rescues = inputs.rows, inputs.rescues
        prompts, completions = rows.prompt_token_ids[sl], rows.token_ids[sl]
        plan = self.plan(prompts, completions)
        ref_logp = self._ref_logprobs(prompts, completions, plan, stages)

        def inputs_at(logp: torch.Tensor) -> LossInputs:
            return self._loss_inputs(inputs, sl, m, logp, kind_all, src_mean_all, proximal, ref_logp)

        one_pass = len(plan) > 1 and self.mode.row_local_loss
        if one_pass:  # each micro-batch's gradient from its own forward; logp comes back without a graph
            T = max(len(c) for c in completions)
            # the mini-batch's tensors once; each micro-batch's leaf only swaps ℓ (and π_prox, which is ℓ on
            # mini-batch 0). Stand-ins for the other rows: the sampler's log-probs (finite, ratio 1)
            base = inputs_at(right_aligned(rows.logprobs[sl], T).to(self.s.device))

            def at_leaf(leaf: torch.Tensor) -> LossInputs:
                prox = leaf.detach() if m == 0 and self.decoupled else base.prox_logp
                return dataclasses.replace(base, logp=leaf, prox_logp=prox)

            logp = self.forward.accumulate_one_pass(
                prompts, completions, plan, base.logprobs,
                lambda leaf: self.mode.minibatch_loss(at_leaf(leaf), self.model, [], self.pad_id,
                                                      self.forward.context)[0])
        elif len(plan) == 1:
            logp = self.forward.logprobs(prompts, completions)  # [b, T], with its graph
        else:  # pass 1: no graph; the loss's backward stops at this leaf
            logp = self.forward.logprobs_no_grad(prompts, completions, plan).requires_grad_(True)
        x = inputs_at(logp)
        # the whole mini-batch's loss and metrics; after one pass only the rescue term (its own forward) has a graph
        loss, metrics, rescue_metrics = self.mode.minibatch_loss(x, self.model, rescues, self.pad_id,
                                                                 self.forward.context)
        if loss.requires_grad:
            loss.backward()
        if len(plan) > 1 and not one_pass:  # pass 2: ∂L/∂ℓ through each micro-batch's graph
            self.forward.backward_through(prompts, completions, plan, logp.grad)
        metrics.update(rescue_metrics)
        return loss.detach(), logp, x, metrics

    def _ref_logprobs(self, prompts: list[list[int]], completions: list[list[int]], plan: list[list[int]],
                      stages: dict) -> torch.Tensor | None:
        """The reference model's log-probs of a mini-batch (no gradient), when the KL term is on."""
        if not (self.s.algorithm.kl_coef > 0 and self.ref_model is not None):
            return None
        t_ref = time.monotonic()
        out = self.forward.logprobs_no_grad(prompts, completions, plan, model=self.ref_model)
        stages["logprob"] += time.monotonic() - t_ref
        return out

    def _loss_inputs(self, inputs: StepInputs, sl: slice, m: int, logp: torch.Tensor, kind_all: torch.Tensor,
                     src_mean_all: torch.Tensor, proximal: torch.Tensor | None,
                     ref_logp: torch.Tensor | None) -> LossInputs:
        """Mini-batch ``m``'s tensors as the mode's loss takes them."""
        rows = inputs.rows
        T, dev = logp.shape[1], logp.device
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
        if (self.correct_behaviour or self.s.behaviour_gap_bound is None or gap is None or not math.isfinite(gap)
                or gap <= self.s.behaviour_gap_bound):
            return
        self.correct_behaviour = True
        log.warning("policy %s: at step %d the sampler's log-probs differ from the learner's by %.3f nats at the "
                    "99th percentile (bound %.3f): the behaviour correction is on from the next step (docs: "
                    "algorithms §7.1)", self.policy, step, gap, self.s.behaviour_gap_bound)

    def state_bytes(self) -> int:
        """Bytes of what the learner holds between steps: weights and optimiser state (gradients are freed after
        each update) — a policy's share of a run's memory before activations."""
        tensors = [*self.model.parameters(), *(v for st in self.opt.state.values() for v in st.values()
                                               if isinstance(v, torch.Tensor))]
        return int(sum(t.numel() * t.element_size() for t in tensors))


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
