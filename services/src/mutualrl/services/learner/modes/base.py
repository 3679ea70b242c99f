"""What every sharing mode is, and the isolated learner every mode starts from.

A sharing mode is one class (docs/algorithms.md §3.3): its name, the SEE experience kinds it
reads from peers, its settings (``sharing.<name>`` in the experiment config, when it has any),
and its strategy — how a step's own and peer experience become rows, advantages, mini-batches
and a loss, how it changes the optimiser, and what it adds to a step's record. The learner
(:mod:`mutualrl.services.learner.learner`) asks its mode and never names one; the formulas are
pure functions in ``mutualrl.grpo``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch

from mutualrl.config import AlgorithmConfig, SharingConfig
from mutualrl.config.schema import OptimConfig
from mutualrl.grpo import (
    SEQUENCE_LEVEL_LOSSES,
    CapabilityTracker,
    PolicyLossOutput,
    RescueItem,
    agg_loss,
    decoupled_policy_loss,
    get_policy_loss,
    grpo_advantages,
    kl_penalty,
    sequence_mean,
)
from mutualrl.grpo.registry import Registry
from mutualrl.services.learner.objective import OWN, PEER, LossInputs, Rows, StepAdvantages
from mutualrl.services.learner.peer_experience import IntakeResult, PeerRow, PeerStats
from mutualrl.services.learner.success_bank import SuccessBank

MODES: Registry = Registry("sharing mode")
"""Every sharing mode's class under its name; ``sharing.mode``'s literal lists exactly these."""


def register_mode(cls: type[SharingMode]) -> type[SharingMode]:
    """Register a mode class under its ``name`` (the one place a mode's name is bound)."""
    return MODES.register(cls.name)(cls)


def record_keys() -> tuple[str, ...]:
    """The record fields any mode contributes: every step's record has them all (None when its
    mode has no value), so a metrics file has the same columns whatever the mode."""
    return tuple(sorted({k for name in MODES.names() for k in MODES.get(name).record_keys}))


def consecutive_minibatches(n: int, size: int | None) -> list[slice]:
    """Consecutive slices in row order (no shuffle: HACPO's self-first schedule depends on it)."""
    if not size or size >= n:
        return [slice(0, n)]
    return [slice(i, min(n, i + size)) for i in range(0, n, size)]


def group_ids(rows: Rows) -> tuple[torch.Tensor, dict[str, int]]:
    """Each row's prompt group as an index 0..K-1 (in order of first appearance) and the index of each prompt."""
    gid: dict[str, int] = {}
    return torch.tensor([gid.setdefault(p, len(gid)) for p in rows.prompt_id]), gid


@dataclass
class StepSharing:
    """A mode's decisions for one step before its update: the rescues it trains, the own groups in which no
    sample succeeded (the gate), and how many peer rows it dropped."""
    rescues: list[RescueItem]
    gate_open: int
    dropped_peer_rows: int


class SharingMode:
    """The isolated learner, and the hooks every mode may change. A mode subclasses it, sets the
    class attributes and overrides only what it does differently.

    The learner asks its mode four things a step, through the entry points at the end of this class:
    ``begin_step`` (peer rows, observation, rescues, gate), ``advantages``, per mini-batch ``minibatches`` and
    ``minibatch_loss``, and ``report``; each entry point calls the finer hooks a mode overrides."""

    name: ClassVar[str]
    section: ClassVar[str]  # where docs/algorithms.md specifies it
    peer_kinds: ClassVar[tuple[str, ...]] = ()  # SEE payload kinds the learner reads from peers
    record_keys: ClassVar[tuple[str, ...]] = ()  # fields this mode adds to a step's record (from its loss metrics)
    samples_rescues: ClassVar[bool] = False  # the learner runs a rescue round on its own engine (SGT-R)
    # ∂loss/∂ℓ of a row depends on that row's log-probs and on data only (no statistic of other rows' ℓ): a
    # micro-batched update then takes one pass per micro-batch (§7.2). A mode that pools ℓ across rows sets False
    row_local_loss: ClassVar[bool] = True

    def __init__(self, policy: str, algorithm: AlgorithmConfig, sharing: SharingConfig, max_new_tokens: int,
                 tracker: CapabilityTracker | None):
        self.policy = policy
        self.a = algorithm
        self.sh = sharing
        self.norm_len = algorithm.loss_scale_factor or max_new_tokens
        self.tracker = tracker
        self.base = get_policy_loss(algorithm.loss)
        self.sequence_level = algorithm.loss in SEQUENCE_LEVEL_LOSSES
        self.clip_low, self.clip_high = algorithm.clip_bounds()
        self.is_cap = 2.0  # async.is_cap: the decoupled objective's truncation (the learner sets it)

    # ---- what the mode needs -----------------------------------------------------------------
    @staticmethod
    def needs_tracker(sharing: SharingConfig) -> bool:
        """Whether the mode weighs peers by capability (a CapabilityTracker, §2.2)."""
        return False

    @classmethod
    def optim(cls, sharing: SharingConfig, optim: OptimConfig, n_peers: int) -> OptimConfig:
        """The optimiser settings a learner runs with under this mode (unchanged by default)."""
        return optim

    # ---- experience -> rows -------------------------------------------------------------------
    def observe(self, own_rewards: list[float], intake: IntakeResult) -> None:
        """Once per step, before the update: every agent's rewards into the capability tracker (§2.2)."""
        if self.tracker is not None:
            self.tracker.update({self.policy: own_rewards, **intake.peer_rewards})

    def peer_rows(self, rows: list[PeerRow]) -> tuple[list[PeerRow], int]:
        """The peer rows to train, in order, and how many were dropped."""
        return sorted(rows, key=lambda r: (r.prompt_id, r.source_policy, r.sample_index)), 0

    def rescues(self, rows: Rows, intake: IntakeResult, own_successes: dict[str, int],
                group_size: int) -> list[RescueItem]:
        """Peer successes this step trains on (SGT); none by default."""
        return []

    def success_bank(self) -> SuccessBank | None:
        """A bank for peers' verified successes on prompts not trained now (SGT under bounded peers); none by
        default."""
        return None

    def gate_open(self, own_successes: dict[str, int], group_size: int) -> int:
        """Groups in which no own sample succeeded — the support gap sharing exists for,
        reported for every mode (SGT counts the groups its gate opens on)."""
        return sum(1 for n in own_successes.values() if n <= 0)

    def shared_in(self, peer_rows: int, rescues: list[RescueItem], stats: dict[str, list[PeerStats]]) -> int:
        """How much peer experience entered this step's loss."""
        return peer_rows + len(rescues)

    # ---- advantages, once per step ----------------------------------------------------------
    def advantages(self, rows: Rows, peer_stats: dict[str, list[PeerStats]]) -> StepAdvantages:
        """Group-relative advantages over each prompt's rows (§1)."""
        rewards, groups = torch.tensor(rows.reward), group_ids(rows)[0]
        adv = grpo_advantages(rewards, groups, norm_by_std=self.a.norm_adv_by_std, epsilon=self.a.epsilon)
        return StepAdvantages(adv, torch.ones(len(rows)))

    # ---- mini-batches and their loss ----------------------------------------------------------
    def minibatches(self, rows: Rows, minibatch_rows: int | None) -> list[slice]:
        """The step's mini-batches as slices of its rows, one optimiser update each."""
        return consecutive_minibatches(len(rows), minibatch_rows)

    def policy_gradient_rows(self, kind: torch.Tensor) -> torch.Tensor:
        """Rows beyond the own ones that the policy-gradient loss trains against their own ``logprobs`` as π_old
        (SGT-R's rescue samples); none by default."""
        return torch.zeros_like(kind, dtype=torch.bool)

    def on_policy_rows(self, kind: torch.Tensor) -> torch.Tensor:
        """Rows trained as if the learner sampled them itself (ratio := 1, no IS)."""
        return torch.zeros_like(kind, dtype=torch.bool)

    def loss(self, x: LossInputs) -> PolicyLossOutput:
        """Loss of one mini-batch: the policy-gradient loss on own (and on-policy) rows, the
        mode's extra terms, the KL on own rows. Metrics come back as 0-dim tensors."""
        a = self.a
        logp, mask = x.logp, x.mask
        own = x.kind == OWN
        on_policy = self.on_policy_rows(x.kind)
        base_rows = own | on_policy | self.policy_gradient_rows(x.kind)
        old = torch.where(on_policy[:, None].to(logp.device), logp.detach(), x.logprobs)  # [b, T]
        total = logp.sum() * 0.0
        metrics: dict[str, torch.Tensor | float] = {}
        if base_rows.any():
            pg = self._policy_gradient(x, old, base_rows, on_policy)
            total = total + pg.loss
            metrics.update(pg.metrics)
        extra = self.peer_loss(x)
        if extra is not None:
            total = total + extra.loss
            metrics.update(extra.metrics)
        if a.kl_coef > 0 and x.ref_logp is not None and own.any():
            kl = agg_loss(kl_penalty(logp[own], x.ref_logp[own], a.kl_type), mask[own], a.loss_agg,
                          norm_len=self.norm_len)
            total = total + a.kl_coef * kl
            metrics["kl"] = kl.detach()
        return PolicyLossOutput(total, metrics)

    def _policy_gradient(self, x: LossInputs, old: torch.Tensor, rows: torch.Tensor,
                         on_policy: torch.Tensor) -> PolicyLossOutput:
        """The configured policy loss on ``rows`` against ``old`` (§1); with pipelined sampling, the decoupled
        objective (§6): the clip anchored at π_prox, the sampler's π_old weighting each token."""
        kw = dict(clip_low=self.clip_low, clip_high=self.clip_high, clip_ratio_c=self.a.clip_ratio_c,
                  loss_agg=self.a.loss_agg, norm_len=self.norm_len)
        logp, adv, mask = x.logp[rows], x.advantages[rows], x.mask[rows]
        if x.token_weight is not None:  # detached per-token weights (SGT-R's rescued rows, §3.5): w·Â
            w = x.token_weight[rows]
            adv = adv * sequence_mean(w, mask) if self.sequence_level else adv[:, None] * w
        if x.prox_logp is None:
            return self.base(logp, old[rows], adv, mask, **kw)
        # rows trained as on-policy take their own log-probs as π_prox too (w = 1, r = 1)
        prox = torch.where(on_policy[:, None].to(logp.device), x.logp.detach(), x.prox_logp)
        return decoupled_policy_loss(self.base, logp, prox[rows], old[rows], adv, mask, is_cap=self.is_cap,
                                     sequence_level=self.sequence_level, **kw)

    def peer_loss(self, x: LossInputs) -> PolicyLossOutput | None:
        """A loss term on peer rows beyond the policy-gradient one (PRP); none by default."""
        return None

    def rescue_loss(self, model, rescues: list[RescueItem], minibatch_index: int,
                    pad_id: int) -> tuple[torch.Tensor | None, dict]:
        """A term on rescued successes added to one mini-batch's loss (SGT's NLL); none by default."""
        return None, {}

    # ---- what a step reports ------------------------------------------------------------------
    def clip_fraction(self, metrics: dict) -> float | None:
        """The record's ``clip_frac``: the share of own tokens the policy-gradient loss clipped."""
        return metrics.pop("clip_frac", None)

    # ---- the entry points the learner calls ---------------------------------------------------
    def begin_step(self, rows: Rows, intake: IntakeResult, own_rewards: list[float], own_successes: dict[str, int],
                   group_size: int) -> StepSharing:
        """The mode's part of a step before its advantages, in this order: the peer rows it trains appended to
        ``rows`` after the own ones, every agent's rewards observed (once per step, before the update: §2.2),
        then the rescues it trains and the groups its gate opens on."""
        peer_rows, dropped = self.peer_rows(intake.rows)
        for r in peer_rows:
            rows.add_row(r, kind=PEER)
        self.observe(own_rewards, intake)
        return StepSharing(self.rescues(rows, intake, own_successes, group_size),
                           self.gate_open(own_successes, group_size), dropped)

    def minibatch_loss(self, x: LossInputs, model, rescues: list[RescueItem], pad_id: int,
                       context: Callable) -> tuple[torch.Tensor, dict, dict]:
        """One mini-batch's loss: the mode's loss on its rows, plus its term on rescued successes (computed
        under ``context()``, the precision's autocast). Returns the loss, the loss's metrics and the rescue
        term's metrics."""
        out = self.loss(x)
        with context():
            extra, extra_metrics = self.rescue_loss(model, rescues, x.minibatch_index, pad_id)
        return (out.loss if extra is None else out.loss + extra), dict(out.metrics), extra_metrics

    def report(self, metrics: dict, peer_rows: int, rescues: list[RescueItem],
               stats: dict[str, list[PeerStats]]) -> tuple[int, float | None]:
        """What the step's record says of the sharing: how much peer experience entered the loss, and the
        clip fraction (taken out of ``metrics``)."""
        return self.shared_in(peer_rows, rescues, stats), self.clip_fraction(metrics)


def make_mode(policy: str, algorithm: AlgorithmConfig, sharing: SharingConfig, max_new_tokens: int) -> SharingMode:
    """The mode registered for ``sharing.mode``, with a capability tracker when it weighs peers."""
    cls = MODES.get(sharing.mode)
    c = sharing.capability
    tracker = CapabilityTracker(c.window, c.metric, c.minimum, c.ratio_min, c.ratio_max,
                                c.warmup_steps) if cls.needs_tracker(sharing) else None
    return cls(policy, algorithm, sharing, max_new_tokens, tracker)
