"""``hacpo``: capability-aware advantages, exponential importance sampling, stepwise clipping and
ω, over complete peer groups trained one source per mini-batch (docs/algorithms.md §2.7–2.8)."""

from __future__ import annotations

import logging
from collections import Counter

import torch
from typing_extensions import override

from mutualrl.config import SharingConfig
from mutualrl.config.schema import OptimConfig
from mutualrl.grpo import PolicyLossOutput, hacpo_advantages, hacpo_loss
from mutualrl.services.learner.modes.base import SharingMode, consecutive_minibatches, group_ids, register_mode
from mutualrl.services.learner.objective import OWN, LossInputs, Rows, StepAdvantages
from mutualrl.services.learner.peer_experience import PeerRow, PeerStats
from mutualrl.services.learner.step_record import cross_rows_split

log = logging.getLogger("mutualrl.learner.hacpo")

INERT_WARN_STEPS = 3
"""Consecutive steps with < 1 cross row not below the ratio's lower bound after which HACPO says it is not sharing."""


def hacpo_minibatches(kinds: list[int], sources: list[str], self_parts: int, cross_parts: int) -> list[slice]:
    """HACPO as its authors run it: own rows in ``self_parts`` near-equal mini-batches, then each
    source's rows (consecutive) in ``cross_parts`` — never two sources, never own and peer rows,
    in one mini-batch. The stepwise clipping bound grows with the mini-batch index."""
    n_own = 0
    while n_own < len(kinds) and kinds[n_own] == OWN:
        n_own += 1
    if any(k == OWN for k in kinds[n_own:]):
        raise ValueError("HACPO needs own rows before peer rows")
    out = _split(0, n_own, self_parts)
    i = n_own
    while i < len(kinds):
        j = i
        while j < len(kinds) and sources[j] == sources[i]:
            j += 1
        out += _split(i, j, cross_parts)
        i = j
    return out


def _split(start: int, stop: int, parts: int) -> list[slice]:
    n = stop - start
    if n <= 0:
        return []
    parts = min(parts, n)
    bounds = [start + (n * k) // parts for k in range(parts + 1)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]


@register_mode
class Hacpo(SharingMode):
    """HACPO (settings: ``sharing.hacpo``): complete peer groups only, one source per mini-batch
    after the self mini-batches (the paper's schedule), capability-weighted advantages and HACPO's loss."""

    name = "hacpo"
    section = "§2.7"
    peer_kinds = ("rollout",)
    _inert_steps = 0  # the current run of steps with < 1 cross row not below the ratio's lower bound (see report)

    @staticmethod
    @override
    def needs_tracker(sharing: SharingConfig) -> bool:
        return True

    @classmethod
    def optim(cls, sharing: SharingConfig, optim: OptimConfig, n_peers: int) -> OptimConfig:
        """The paper schedule takes ``self_minibatches + cross_minibatches · peers`` updates per
        step; with ``scale_lr`` the learning rate is divided by that count (§2.8)."""
        h = sharing.hacpo
        if h.schedule != "paper" or not h.scale_lr:
            return optim
        updates = h.self_minibatches + h.cross_minibatches * max(1, n_peers)
        return optim.model_copy(update={"lr": optim.lr / updates})

    def peer_rows(self, rows: list[PeerRow]) -> tuple[list[PeerRow], int]:
        """Each peer's complete group per prompt (§2.3 [CODE]): a group missing rows (one
        rejected by THL) is dropped whole; sorted by source, one source per mini-batch."""
        rows = sorted(rows, key=lambda r: (r.source_policy, r.prompt_id, r.sample_index))
        sizes = Counter((r.prompt_id, r.source_policy) for r in rows)
        complete = [r for r in rows if sizes[(r.prompt_id, r.source_policy)] == r.group_size]
        return complete, len(rows) - len(complete)

    @override
    def advantages(self, rows: Rows, peer_stats: dict[str, list[PeerStats]]) -> StepAdvantages:
        assert self.tracker is not None
        rewards, groups, kind = torch.tensor(rows.reward), group_ids(rows)[0], torch.tensor(rows.kind)
        ratio = {src: self.tracker.ratio(src, self.policy) for src in set(rows.source_policy)}  # clip(P̂_src / P̂_k)
        omega = torch.tensor([1.0 if k == OWN else ratio[src] for k, src in zip(rows.kind, rows.source_policy)])
        weight = 1.0 / omega  # ω^(k,src) = clip(P̂_k / P̂_src); 1 on own rows
        adv, base = hacpo_advantages(rewards, groups, weight, kind == OWN, epsilon=self.a.epsilon,
                                     binary_baseline_guard=self.sh.hacpo.binary_baseline_guard)
        return StepAdvantages(adv, omega, {"hacpo_baseline_mean": float(base.mean()) if len(rows) else 0.0,
                                           "capability_self": self.tracker.capability(self.policy)})

    @override
    def minibatches(self, rows: Rows, minibatch_rows: int | None) -> list[slice]:
        h = self.sh.hacpo
        if h.schedule == "paper":
            return hacpo_minibatches(rows.kind, rows.source_policy, h.self_minibatches, h.cross_minibatches)
        return consecutive_minibatches(len(rows), minibatch_rows)

    @override
    def loss(self, x: LossInputs) -> PolicyLossOutput:
        h, a = self.sh.hacpo, self.a
        return hacpo_loss(
            x.logp, x.mask, x.source_mean_logprob, x.advantages, (x.kind == OWN).to(x.logp.device), x.omega,
            minibatch_index=x.minibatch_index, alpha=h.alpha, delta=h.delta, delta_step=h.delta_step,
            self_clip_low=h.self_clip_low, self_clip_high=h.self_clip_high, max_abs_log_ratio=h.max_abs_log_ratio,
            ref_logp=x.ref_logp, kl_coef=a.kl_coef, kl_type=a.kl_type, kl_agg=a.loss_agg, norm_len=self.norm_len,
        )

    @override
    def clip_fraction(self, metrics: dict) -> float | None:
        return metrics.get("self_clip_frac")  # own rows are clipped by HACPO's self bounds

    @override
    def report(self, metrics: dict, peer_rows: int, rescues: list, stats: dict) -> tuple[int, float | None]:
        """As every mode's, and a WARNING once HACPO has kept < 1 cross row a step at or above the ratio's lower
        bound for :data:`INERT_WARN_STEPS` steps in a row: below the lower bound the hard clamp leaves a row no
        gradient (§2.7), which is where two model families' sequence ratios sit (SmolLM2 beside a Qwen: 0.02–0.66
        against 0.85), so the run is GSPO on its own rows with a mixed baseline, not sharing — the user should hear
        it during the run, not from the report afterwards. The warning names the baseline because it is what still
        moves a weak policy then: its all-fail groups on prompts a peer solved push every own row down, where GRPO
        would leave them at zero (measured between two real families in §2.7)."""
        split = cross_rows_split(metrics)
        if split is not None:
            self._inert_steps = self._inert_steps + 1 if split[1] < 1 else 0
            if self._inert_steps == INERT_WARN_STEPS:
                log.warning("policy %s: HACPO kept no peer row at or above its ratio's lower bound for %d steps in a "
                            "row (the peers' sequence ratio %.2f, the lower bound %.3f): rows below it have no "
                            "gradient, so it is training on its own rows only, against a baseline its peers' "
                            "rewards still raise: on a prompt only a peer solved, every own row is pushed down "
                            "(§2.3); between model families this far apart, share with sgt or sgt_r instead "
                            "(docs: algorithms §2.7)", self.policy,
                            self._inert_steps,
                            metrics.get("cross_ratio_mean") or float("nan"),
                            metrics.get("cross_lower_bound") or float("nan"))
        return super().report(metrics, peer_rows, rescues, stats)
