"""One strategy per sharing mode: how a step's own and peer experience become loss inputs.

The learner is algorithm-blind: it gathers experience, asks its strategy (registered under the
mode's name, docs/algorithms.md §3.3) to order peer rows, add rescues, compute the step's
advantages, cut mini-batches and build each mini-batch's loss, then steps the optimiser and
publishes weights. It never names a mode. The formulas live in ``mutualrl.grpo``; a strategy only
decides which applies to which row:

- ``none`` (isolated GRPO/GSPO): own rows, group-relative advantages (§1).
- ``naive``: peer rows pooled into the group and trained as if sampled by the learner (§2.9).
- ``prp``: pooled group; peer rows get a truncated density-ratio loss (§3.3 PRP).
- ``xgrpo``: own rows; the baseline and scale come from peers' AdvantageStats (§3.3 XGRPO).
- ``sgt``: own rows plus re-verified peer successes on all-fail groups, as an NLL term or
  inserted into the group (§3.3 SGT).
- ``hacpo``: capability-weighted advantages, exponential IS, stepwise clipping, complete peer
  groups one source per mini-batch (§2.7–2.8).
"""

from __future__ import annotations

from collections import Counter

import torch

from mutualrl.config import AlgorithmConfig, SharingConfig
from mutualrl.grpo import (
    CapabilityTracker,
    PolicyLossOutput,
    RescueItem,
    agg_loss,
    get_policy_loss,
    group_insert_advantages,
    grpo_advantages,
    hacpo_advantages,
    hacpo_loss,
    kl_penalty,
    prp_peer_loss,
    select_rescues,
    sgt_nll,
    xgrpo_advantages,
)
from mutualrl.grpo.registry import Registry
from mutualrl.models.generation import sequence_logprobs
from mutualrl.services.learner.objective import OWN, PEER, RESCUE, Rows, StepAdvantages
from mutualrl.services.learner.peer_experience import IntakeResult, PeerStats

STRATEGIES: Registry = Registry("sharing strategy")


def consecutive_minibatches(n: int, size: int | None) -> list[slice]:
    """Consecutive slices in row order (no shuffle: HACPO's self-first schedule depends on it)."""
    if not size or size >= n:
        return [slice(0, n)]
    return [slice(i, min(n, i + size)) for i in range(0, n, size)]


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


class SharingStrategy:
    """The isolated learner (``none``), and the hooks every mode may change. Subclasses override
    only what their mode does differently."""

    def __init__(self, policy: str, algorithm: AlgorithmConfig, sharing: SharingConfig, max_new_tokens: int, tracker: CapabilityTracker | None):
        self.policy = policy
        self.a = algorithm
        self.sh = sharing
        self.norm_len = algorithm.loss_scale_factor or max_new_tokens
        self.tracker = tracker
        self.base = get_policy_loss(algorithm.loss)
        self.clip_low, self.clip_high = algorithm.clip_bounds()

    @staticmethod
    def needs_tracker(sharing: SharingConfig) -> bool:
        """Whether the mode weighs peers by capability (a CapabilityTracker, §2.2)."""
        return False

    # ---- experience -> rows ---------------------------------------------------------------
    def peer_rows(self, rows: list) -> tuple[list, int]:
        """The peer rows to train, in order, and how many were dropped."""
        return sorted(rows, key=lambda r: (r.prompt_id, r.source_policy, r.sample_index)), 0

    def rescues(self, rows: Rows, intake: IntakeResult, own_successes: dict[str, int], group_size: int) -> list[RescueItem]:
        """Peer successes this step trains on (SGT); none by default."""
        return []

    def gate_open(self, own_successes: dict[str, int], group_size: int) -> int:
        """Groups at or under the SGT gate (τ·G own successes; τ = 0: all-fail groups) — the
        support gap sharing exists for, reported for every mode."""
        return sum(1 for n in own_successes.values() if n <= self.sh.sgt.gate_tau * group_size)

    def shared_in(self, peer_rows: int, rescues: list[RescueItem], stats: dict[str, list[PeerStats]]) -> int:
        """How much peer experience entered this step's loss."""
        return peer_rows + len(rescues)

    # ---- advantages, once per step ----------------------------------------------------------
    def advantages(self, rows: Rows, peer_stats: dict[str, list[PeerStats]]) -> StepAdvantages:
        rewards, groups = torch.tensor(rows.reward), self._groups(rows)[0]
        adv = grpo_advantages(rewards, groups, norm_by_std=self.a.norm_adv_by_std, epsilon=self.a.epsilon)
        return StepAdvantages(adv, torch.ones(len(rows)))

    @staticmethod
    def _groups(rows: Rows) -> tuple[torch.Tensor, dict[str, int]]:
        gid: dict[str, int] = {}
        return torch.tensor([gid.setdefault(p, len(gid)) for p in rows.prompt_id]), gid

    # ---- mini-batches and their loss ----------------------------------------------------------
    def minibatches(self, rows: Rows, minibatch_rows: int | None) -> list[slice]:
        return consecutive_minibatches(len(rows), minibatch_rows)

    def on_policy_rows(self, kind: torch.Tensor) -> torch.Tensor:
        """Rows trained as if the learner sampled them itself (ratio := 1, no IS)."""
        return torch.zeros_like(kind, dtype=torch.bool)

    def loss(self, *, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, kind: torch.Tensor,
             source_mean_logp: torch.Tensor, omega: torch.Tensor, minibatch_index: int, ref_logp: torch.Tensor | None) -> PolicyLossOutput:
        """Loss of one mini-batch (all tensors are its rows: [b, T] or [b]): the policy-gradient
        loss on own (and on-policy) rows, the mode's extra terms, the KL on own rows.

        ``kind`` stays on the host: which rows are own or peer is known before the forward pass,
        so choosing them never waits for the device; metrics come back as 0-dim tensors."""
        a = self.a
        own = kind == OWN
        on_policy = self.on_policy_rows(kind)
        base_rows = own | on_policy
        old = torch.where(on_policy[:, None].to(logp.device), logp.detach(), old_logp)
        total = logp.sum() * 0.0
        metrics: dict[str, torch.Tensor | float] = {}
        if base_rows.any():
            pg = self.base(logp[base_rows], old[base_rows], adv[base_rows], mask[base_rows], clip_low=self.clip_low, clip_high=self.clip_high,
                           clip_ratio_c=a.clip_ratio_c, loss_agg=a.loss_agg, norm_len=self.norm_len)
            total = total + pg.loss
            metrics.update(pg.metrics)
        extra = self.peer_loss(logp, old_logp, mask, adv, kind, source_mean_logp)
        if extra is not None:
            total = total + extra.loss
            metrics.update(extra.metrics)
        if a.kl_coef > 0 and ref_logp is not None and own.any():
            kl = agg_loss(kl_penalty(logp[own], ref_logp[own], a.kl_type), mask[own], a.loss_agg, norm_len=self.norm_len)
            total = total + a.kl_coef * kl
            metrics["kl"] = kl.detach()
        return PolicyLossOutput(total, metrics)

    def peer_loss(self, logp, old_logp, mask, adv, kind, source_mean_logp) -> PolicyLossOutput | None:
        """A loss term on peer rows beyond the policy-gradient one (PRP); none by default."""
        return None

    def rescue_loss(self, model, rescues: list[RescueItem], minibatch_index: int, pad_id: int) -> tuple[torch.Tensor | None, dict]:
        """A term on rescued successes added to one mini-batch's loss (SGT's NLL); none by default."""
        return None, {}


@STRATEGIES.register("none")
class Isolated(SharingStrategy):
    """Isolated GRPO (or GSPO, by ``algorithm.loss``): own rows only."""


@STRATEGIES.register("naive")
class Naive(SharingStrategy):
    """Peer rows pooled into the group and trained with ratio 1 — the uncorrected baseline (§2.9)."""

    def on_policy_rows(self, kind: torch.Tensor) -> torch.Tensor:
        return kind == PEER


@STRATEGIES.register("prp")
class PeerRolloutPooling(SharingStrategy):
    """Pooled group; peer rows weighted by a truncated density ratio (§3.3 PRP)."""

    def peer_loss(self, logp, old_logp, mask, adv, kind, source_mean_logp) -> PolicyLossOutput | None:
        peer = kind == PEER
        if not peer.any():
            return None
        p = self.sh.prp
        out = prp_peer_loss(logp[peer], mask[peer], adv[peer], peer_logp=old_logp[peer], peer_mean_logp=source_mean_logp[peer],
                            level=p.ratio_level, truncation=p.truncation, loss_agg=self.a.loss_agg, norm_len=self.norm_len)
        return PolicyLossOutput(p.weight * out.loss, out.metrics)


@STRATEGIES.register("xgrpo")
class CrossGroupAdvantages(SharingStrategy):
    """Own rows; each group's baseline and scale pool the peers' AdvantageStats (§3.3 XGRPO)."""

    @staticmethod
    def needs_tracker(sharing: SharingConfig) -> bool:
        return sharing.xgrpo.variant == "calibrated"

    def shared_in(self, peer_rows: int, rescues: list[RescueItem], stats: dict[str, list[PeerStats]]) -> int:
        return peer_rows + len(rescues) + sum(len(v) for v in stats.values())

    def advantages(self, rows: Rows, peer_stats: dict[str, list[PeerStats]]) -> StepAdvantages:
        """Per-prompt [K, M] stat tables filled from the messages, then gathered per row."""
        rewards = torch.tensor(rows.reward)
        groups, gid = self._groups(rows)
        peers = sorted({s.producer for st in peer_stats.values() for s in st})
        col = {p: j for j, p in enumerate(peers)}
        K, M = len(gid), max(1, len(peers))
        table = [[[0.0, 0.0, 0.0] for _ in range(M)] for _ in range(K)]  # (count, mean, std); filled in Python, one tensor after
        for pid, stats in peer_stats.items():
            k = gid.get(pid)
            if k is None:
                continue
            for st in stats:
                table[k][col[st.producer]] = [float(st.count), st.mean, st.std]
        t = torch.tensor(table)  # [K, M, 3]
        count, mean, std = t[..., 0], t[..., 1], t[..., 2]
        omega = torch.ones(M)
        if self.tracker is not None:
            for p, j in col.items():
                omega[j] = self.tracker.ratio(self.policy, p)  # ω^(n,m) = P̂_n / P̂_m
        x = self.sh.xgrpo
        adv, base, _ = xgrpo_advantages(
            rewards, groups, count[groups], mean[groups], std[groups], variant=x.variant, peer_weight=x.peer_weight,
            peer_omega=omega.expand(len(rows), M) if x.variant == "calibrated" else None, norm_by_std=self.a.norm_adv_by_std, epsilon=self.a.epsilon,
        )
        return StepAdvantages(adv, torch.ones(len(rows)), {"xgrpo_baseline_mean": float(base.mean()) if len(rows) else 0.0})


@STRATEGIES.register("sgt")
class SuccessGatedTransfer(SharingStrategy):
    """Re-verified peer successes on own all-fail groups (gate τ), the shortest K_r per prompt:
    a λ-weighted NLL term (``nll``) or rows inserted into the group (``group_insert``) (§3.3 SGT)."""

    def rescues(self, rows: Rows, intake: IntakeResult, own_successes: dict[str, int], group_size: int) -> list[RescueItem]:
        g = self.sh.sgt
        rescues = select_rescues(intake.rescues, own_successes, group_size, g.gate_tau, g.max_per_prompt)
        if g.variant == "group_insert":
            for x in rescues:
                rows.add(prompt_ids=x.prompt_ids, completion_ids=x.completion_ids, old_logp=[0.0] * len(x.completion_ids),
                         mask=[1.0] * len(x.completion_ids), reward=1.0, prompt_id=x.prompt_id, source=x.source_policy,
                         kind=RESCUE, source_mean_logp=0.0)
        return rescues

    def advantages(self, rows: Rows, peer_stats: dict[str, list[PeerStats]]) -> StepAdvantages:
        if self.sh.sgt.variant == "nll":
            return super().advantages(rows, peer_stats)
        rewards, groups, kind = torch.tensor(rows.reward), self._groups(rows)[0], torch.tensor(rows.kind)
        own = kind == OWN
        own_adv, res_adv = group_insert_advantages(rewards[own], groups[own], groups[~own], norm_by_std=self.a.norm_adv_by_std, epsilon=self.a.epsilon)
        adv = torch.zeros(len(rows))
        adv[own], adv[~own] = own_adv, res_adv
        return StepAdvantages(adv, torch.ones(len(rows)))

    def on_policy_rows(self, kind: torch.Tensor) -> torch.Tensor:
        return kind == RESCUE  # inserted rescues: ratio 1

    def rescue_loss(self, model, rescues: list[RescueItem], minibatch_index: int, pad_id: int) -> tuple[torch.Tensor | None, dict]:
        if minibatch_index != 0 or not rescues or self.sh.sgt.variant != "nll":
            return None, {}
        r_logp, r_mask = sequence_logprobs(model, [x.prompt_ids for x in rescues], [x.completion_ids for x in rescues], pad_id=pad_id)
        nll = sgt_nll(r_logp, r_mask)
        return self.sh.sgt.weight * nll, {"sgt_nll": nll.detach()}


@STRATEGIES.register("hacpo")
class Hacpo(SharingStrategy):
    """HACPO (§2.7–2.8): complete peer groups only, one source per mini-batch after the self
    mini-batches (the paper's schedule), capability-weighted advantages and HACPO's loss."""

    @staticmethod
    def needs_tracker(sharing: SharingConfig) -> bool:
        return True

    def peer_rows(self, rows: list) -> tuple[list, int]:
        """Each peer's complete group per prompt (§2.3 [CODE]): a group missing rows (one
        rejected by THL) is dropped whole; sorted by source, one source per mini-batch."""
        rows = sorted(rows, key=lambda r: (r.source_policy, r.prompt_id, r.sample_index))
        sizes = Counter((r.prompt_id, r.source_policy) for r in rows)
        complete = [r for r in rows if sizes[(r.prompt_id, r.source_policy)] == r.group_size]
        return complete, len(rows) - len(complete)

    def advantages(self, rows: Rows, peer_stats: dict[str, list[PeerStats]]) -> StepAdvantages:
        assert self.tracker is not None
        rewards, groups, kind = torch.tensor(rows.reward), self._groups(rows)[0], torch.tensor(rows.kind)
        ratio = {src: self.tracker.ratio(src, self.policy) for src in set(rows.source)}  # clip(P̂_src / P̂_k)
        omega = torch.tensor([1.0 if k == OWN else ratio[src] for k, src in zip(rows.kind, rows.source)])
        weight = 1.0 / omega  # ω^(k,src) = clip(P̂_k / P̂_src); 1 on own rows
        adv, base = hacpo_advantages(rewards, groups, weight, kind == OWN, epsilon=self.a.epsilon, binary_baseline_guard=self.sh.hacpo.binary_baseline_guard)
        return StepAdvantages(adv, omega, {"hacpo_baseline_mean": float(base.mean()) if len(rows) else 0.0,
                                           "capability_self": self.tracker.capability(self.policy)})

    def minibatches(self, rows: Rows, minibatch_rows: int | None) -> list[slice]:
        h = self.sh.hacpo
        if h.schedule == "paper":
            return hacpo_minibatches(rows.kind, rows.source, h.self_minibatches, h.cross_minibatches)
        return super().minibatches(rows, minibatch_rows)

    def loss(self, *, logp, old_logp, mask, adv, kind, source_mean_logp, omega, minibatch_index, ref_logp) -> PolicyLossOutput:
        h, a = self.sh.hacpo, self.a
        return hacpo_loss(
            logp, mask, source_mean_logp, adv, (kind == OWN).to(logp.device), omega,
            minibatch_index=minibatch_index, alpha=h.alpha, delta=h.delta, delta_step=h.delta_step,
            self_clip_low=h.self_clip_low, self_clip_high=h.self_clip_high, max_abs_log_ratio=h.max_abs_log_ratio,
            ref_logp=ref_logp, kl_coef=a.kl_coef, kl_type=a.kl_type, kl_agg=a.loss_agg, norm_len=self.norm_len,
        )


def make_strategy(policy: str, algorithm: AlgorithmConfig, sharing: SharingConfig, max_new_tokens: int) -> SharingStrategy:
    """The strategy registered for ``sharing.mode``, with a capability tracker when it weighs peers."""
    cls = STRATEGIES.get(sharing.mode)
    c = sharing.capability
    tracker = CapabilityTracker(c.window, c.metric, c.minimum, c.ratio_min, c.ratio_max, c.warmup_steps) if cls.needs_tracker(sharing) else None
    return cls(policy, algorithm, sharing, max_new_tokens, tracker)
