"""The learner: one optimiser step per training step from own rollouts (+ peer experience).

Algorithm-blind plumbing: the objective comes from ``mutualrl.grpo``; this
module gathers inputs from SEE, runs the model, steps the optimiser and
publishes the new weights version (write, then announce).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mutualrl.config import AlgorithmConfig, SharingConfig
from mutualrl.config.schema import OptimConfig
from mutualrl.grpo import agg_loss, grpo_advantages, kl_penalty, ppo_clip_loss, select_rescues, sgt_nll
from mutualrl.models.generation import sequence_logprobs
from mutualrl.see import ExperienceExchange, Received
from mutualrl.services.learner.peer_experience import PeerIntake
from mutualrl.services.rollout.weights import WeightStore
from mutualrl.tasks import Problem
from mutualrl.v1 import experience_pb2 as pb


@dataclass
class LearnerSettings:
    group_size: int
    algorithm: AlgorithmConfig
    sharing: SharingConfig
    optim: OptimConfig
    device: str = "cpu"
    peer_deadline_s: float = 30.0  # how long to wait for experience before training on what arrived


def _pad_right_aligned(rows: list[list[float]], T: int) -> torch.Tensor:
    out = torch.zeros(len(rows), T)
    for i, r in enumerate(rows):
        if r:
            out[i, T - len(r) :] = torch.tensor(r)
    return out


class Learner:
    def __init__(
        self,
        policy: str,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        exchange: ExperienceExchange,
        intake: PeerIntake,
        store: WeightStore,
        settings: LearnerSettings,
        peers: list[str],
        ref_model: PreTrainedModel | None = None,
    ):
        self.policy = policy
        self.model = model.to(settings.device)
        self.tok = tokenizer
        self.ex = exchange
        self.intake = intake
        self.store = store
        self.s = settings
        self.ref_model = ref_model
        self.version = 0
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=settings.optim.lr, weight_decay=settings.optim.weight_decay)
        self.own = exchange.subscribe(policy, ["rollout"], [policy], consumer=f"{policy}-learner")
        sharing_kinds = {"sgt": ["verified_success"]}.get(settings.sharing.mode, [])
        self.peer_sub = exchange.subscribe(policy, sharing_kinds, peers, consumer=f"{policy}-learner") if sharing_kinds and peers else None
        self._buffer: list[Received] = []  # own rollouts for future steps
        self._peer_buffer: list[Received] = []
        self.totals: Counter[str] = Counter()

    # ---- gathering -------------------------------------------------------
    def _collect_own(self, step: int, expected: int, deadline: float) -> list[Received]:
        have = [r for r in self._buffer if r.payload.step == step]
        self._buffer = [r for r in self._buffer if r.payload.step > step]
        stale: list[Received] = []
        while len(have) < expected:
            remaining_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
            got = self.own.poll(block_ms=min(remaining_ms, 200) if remaining_ms else None)
            for r in got:
                (have if r.payload.step == step else self._buffer if r.payload.step > step else stale).append(r)
            if not got and remaining_ms == 0:
                break
        if stale:
            self.own.ack(stale)  # rollouts of a step already trained: consumed, not used
            self.totals["own_stale"] += len(stale)
        return have

    def _collect_peer(self, step: int) -> list[Received]:
        if self.peer_sub is None:
            return []
        got = self._peer_buffer + self.peer_sub.poll()
        now = [r for r in got if r.payload.step <= step]
        self._peer_buffer = [r for r in got if r.payload.step > step]
        return now

    # ---- one step --------------------------------------------------------
    def train_step(self, step: int, problems: list[Problem]) -> dict:
        t0 = time.monotonic()
        expected = len(problems) * self.s.group_size
        own = self._collect_own(step, expected, t0 + self.s.peer_deadline_s)
        if not own:
            return {"step": step, "policy": self.policy, "skipped": True, "step_s": time.monotonic() - t0}
        own.sort(key=lambda r: (r.payload.prompt_id, r.payload.sample_index))
        by_id = {p.prompt_id: p for p in problems}

        prompts = [list(r.payload.prompt_token_ids) for r in own]
        completions = [list(r.payload.token_ids) for r in own]
        rewards = torch.tensor([r.payload.reward for r in own])  # [B]
        gid_map: dict[str, int] = {}
        group_ids = torch.tensor([gid_map.setdefault(r.payload.prompt_id, len(gid_map)) for r in own])  # [B]
        T = max(len(c) for c in completions)
        old_logp = _pad_right_aligned([list(r.payload.logprobs) for r in own], T).to(self.s.device)  # [B, T]

        a = self.s.algorithm
        adv = grpo_advantages(rewards, group_ids, norm_by_std=a.norm_adv_by_std, epsilon=a.epsilon).to(self.s.device)  # [B]
        self.model.train()
        logp, mask = sequence_logprobs(self.model, prompts, completions, pad_id=self.tok.pad_token_id)  # [B, T]
        pg = ppo_clip_loss(logp, old_logp, adv, mask, clip_low=a.clip_low, clip_high=a.clip_high, loss_agg=a.loss_agg)
        loss = pg.loss
        metrics: dict = {"pg_loss": float(pg.loss.detach()), **pg.metrics}

        if a.kl_coef > 0 and self.ref_model is not None:
            with torch.no_grad():
                ref_logp, _ = sequence_logprobs(self.ref_model, prompts, completions, pad_id=self.tok.pad_token_id)
            kl = agg_loss(kl_penalty(logp, ref_logp, "k3"), mask, a.loss_agg)
            loss = loss + a.kl_coef * kl
            kl_value = float(kl.detach())
        else:
            kl_value = metrics["approx_kl"]

        # ---- sharing: SGT rescue set (algorithms.md §3.3) ----
        peer_msgs = self._collect_peer(step)
        own_successes: dict[str, int] = {}
        for r in own:
            own_successes[r.payload.prompt_id] = own_successes.get(r.payload.prompt_id, 0) + (1 if r.payload.reward > 0 else 0)
        intake = self.intake.verified_successes(peer_msgs, step, by_id)
        rescues = []
        if self.s.sharing.mode == "sgt":
            sgt = self.s.sharing.sgt
            rescues = select_rescues(intake.rescues, own_successes, self.s.group_size, sgt.gate_tau, sgt.max_per_prompt)
            if rescues:
                r_logp, r_mask = sequence_logprobs(self.model, [x.prompt_ids for x in rescues], [x.completion_ids for x in rescues], pad_id=self.tok.pad_token_id)
                nll = sgt_nll(r_logp, r_mask)
                loss = loss + sgt.weight * nll
                metrics["sgt_nll"] = float(nll.detach())
        gate_open = sum(1 for n in own_successes.values() if n <= self.s.sharing.sgt.gate_tau * self.s.group_size)

        if not torch.isfinite(loss):
            raise FloatingPointError(f"{self.policy}: non-finite loss at step {step}")
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.s.optim.grad_clip)
        self.opt.step()

        # acknowledge only after the update used them (at-least-once; dedup on redelivery)
        self.own.ack(own)
        if self.peer_sub is not None:
            self.peer_sub.ack(intake.used)
        self.version += 1
        uri, checksum = self.store.put(self.policy, self.version, self.model.state_dict())
        self.ex.publish(pb.WeightsPublished(policy=self.policy, version=self.version, uri=uri, step=step, checksum=checksum), self.policy, self.version)

        for k, v in intake.rejected.items():
            self.totals[f"rejected_{k}"] += v
        self.totals["rescues"] += len(rescues)
        self.totals["shared_in"] += len(rescues)
        residuals = intake.residuals
        return {
            "step": step,
            "policy": self.policy,
            "reward_mean": float(rewards.mean()),
            "loss": float(loss.detach()),
            "kl": kl_value,
            "clip_frac": metrics["clip_frac"],
            "grad_norm": float(grad_norm) if math.isfinite(float(grad_norm)) else None,
            "shared_in": len(rescues),
            "peer_candidates": len(intake.rescues),
            "peer_rejected": dict(intake.rejected),
            "rescue_count": len(rescues),
            "gate_open": gate_open,
            "thl_residual": (sum(residuals) / len(residuals)) if residuals else 0.0,
            "thl_logprob_residual": (sum(intake.logprob_residuals) / len(intake.logprob_residuals)) if intake.logprob_residuals else 0.0,
            "weights_version": self.version,
            "sgt_nll": metrics.get("sgt_nll"),
            "ratio_mean": metrics["ratio_mean"],
            "train_s": time.monotonic() - t0,
        }
