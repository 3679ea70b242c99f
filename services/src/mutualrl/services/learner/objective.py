"""The data a step's objective is built from, under one set of names from the wire to the loss.

A ``Rollout`` on the wire, a peer's row after THL (:class:`~mutualrl.services.learner.peer_experience.PeerRow`),
an SGT rescue and a row of the learner's batch (:class:`Rows`) all call their fields the same:
``prompt_token_ids``, ``token_ids``, ``logprobs`` (the sampler's, i.e. π_old), ``reward``,
``prompt_id``, ``source_policy``. One mini-batch's tensors reach a sharing mode's loss as
:class:`LossInputs`. Which formula applies to which row is each mode's class
(:mod:`mutualrl.services.learner.modes`); the formulas live in ``libs/grpo``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

OWN, PEER, RESCUE, HINTED = 0, 1, 2, 3
"""Row kinds: the learner's own rollout, a peer's (THL-converted) rollout, an SGT rescue, an SGT-R rescue sample (the
learner's own completion, sampled with a peer's hint, trained under the hint-free prompt)."""

ROW_FIELDS = ("prompt_token_ids", "token_ids", "logprobs", "mask", "reward", "prompt_id", "source_policy", "kind",
              "source_mean_logprob")
"""The fields of a training row, in :meth:`Rows.add`'s order."""


@dataclass
class Rows:
    """A step's training rows, column by column, in the order they are trained (own first,
    self-first for HACPO). Row i is the i-th entry of every list."""

    prompt_token_ids: list[list[int]] = field(default_factory=list)  # in the learner's vocabulary
    token_ids: list[list[int]] = field(default_factory=list)  # the completion, in the learner's vocabulary
    # the sampler's log-probs on those tokens (THL-transported on peer rows)
    logprobs: list[list[float]] = field(default_factory=list)
    mask: list[list[float]] = field(default_factory=list)  # tokens that enter the loss
    reward: list[float] = field(default_factory=list)  # the learner's own verifier's score
    prompt_id: list[str] = field(default_factory=list)
    source_policy: list[str] = field(default_factory=list)  # producing policy
    kind: list[int] = field(default_factory=list)  # OWN, PEER, RESCUE or HINTED
    source_mean_logprob: list[float] = field(default_factory=list)  # ℓ̄ of the sampler in its own tokens
    # a detached weight per token multiplying its advantage (SGT-R's toward the hint-free policy); None: 1
    token_weight: list[list[float] | None] = field(default_factory=list)

    def add(self, *, prompt_token_ids, token_ids, logprobs, mask, reward, prompt_id, source_policy, kind,
            source_mean_logprob, token_weight=None) -> None:
        """Append one row (its token ids, log-probs, mask and any token weights must have one entry per token)."""
        if not (len(token_ids) == len(logprobs) == len(mask)) or (token_weight is not None
                                                                 and len(token_weight) != len(token_ids)):
            raise ValueError(f"row of {len(token_ids)} tokens has {len(logprobs)} log-probs, {len(mask)} mask "
                             f"entries and {'no' if token_weight is None else len(token_weight)} token weights")
        self.prompt_token_ids.append(list(prompt_token_ids))
        self.token_ids.append(list(token_ids))
        self.logprobs.append(list(logprobs))
        self.mask.append(list(mask))
        self.reward.append(float(reward))
        self.prompt_id.append(prompt_id)
        self.source_policy.append(source_policy)
        self.kind.append(kind)
        self.source_mean_logprob.append(float(source_mean_logprob))
        self.token_weight.append(None if token_weight is None else [float(w) for w in token_weight])

    def add_row(self, row, *, kind: int) -> None:
        """Append a record that has the row fields as attributes (a :class:`PeerRow`)."""
        self.add(**{f: getattr(row, f) for f in ROW_FIELDS if f != "kind"}, kind=kind)

    def __len__(self) -> int:
        return len(self.reward)

    def token_weights(self, sl: slice, T: int) -> torch.Tensor | None:
        """Rows ``sl``'s token weights [b, T], right-aligned (1 where a row has none), or None when no row has any."""
        chosen = self.token_weight[sl]
        if all(w is None for w in chosen):
            return None
        ones = [[1.0] * len(t) for t in self.token_ids[sl]]
        return right_aligned([w if w is not None else o for w, o in zip(chosen, ones)], T)

    def count(self, kind: int) -> int:
        """How many rows are of ``kind``."""
        return sum(1 for k in self.kind if k == kind)

    def own_sampled_nll(self) -> float | None:
        """The mean of −log π_behaviour(y_t) over the own rows' trained tokens: a Monte-Carlo estimate of the
        sampling distribution's per-token entropy along the paths it took (E_y[−log π(y)] is the entropy), read from
        the log-probs the sampler already returned, so no full-vocabulary softmax is computed. It falls as a policy
        grows surer of its answers; a collapse to one short form shows as a fall towards 0. None without own
        tokens."""
        total, n = 0.0, 0
        for kind, lps, mask in zip(self.kind, self.logprobs, self.mask):
            if kind != OWN:
                continue
            for lp, m in zip(lps, mask):
                if m > 0:
                    total -= lp
                    n += 1
        return total / n if n else None


@dataclass
class StepAdvantages:
    """The advantages of one step's rows, with the statistics the metrics report."""
    advantages: torch.Tensor  # [N]
    omega: torch.Tensor  # [N], HACPO's ω on cross rows (1 elsewhere)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class LossInputs:
    """One mini-batch as a sharing mode's loss sees it: b rows, T completion positions,
    right-aligned like ``sequence_logprobs`` (the completion ends at position T-1)."""
    logp: torch.Tensor  # [b, T] the learner's log-probs of the row's tokens (with gradient)
    logprobs: torch.Tensor  # [b, T] the sampler's log-probs (π_old; on peer rows the peer's, THL-transported)
    mask: torch.Tensor  # [b, T] 1 where a token enters the loss
    advantages: torch.Tensor  # [b] one per row, computed once per step
    kind: torch.Tensor  # [b] OWN/PEER/RESCUE, on the host: choosing rows never waits for the device
    source_mean_logprob: torch.Tensor  # [b] ℓ̄ of the sampler in its own tokens
    omega: torch.Tensor  # [b] HACPO's ω (1 on own rows and in other modes)
    minibatch_index: int  # HACPO's stepwise clipping grows with it; SGT's NLL joins mini-batch 0
    ref_logp: torch.Tensor | None = None  # [b, T] the reference model's log-probs when a KL term is on
    # [b, T] π_prox: the learner's log-probs at the start of the step, when sampling is pipelined (§6)
    prox_logp: torch.Tensor | None = None
    # [b, T] detached per-token weights of the advantages (SGT-R's rescued rows, §3.5); None: all 1
    token_weight: torch.Tensor | None = None


def right_aligned(rows: list[list[float]], T: int) -> torch.Tensor:
    """Per-token lists into a [B, T] tensor aligned like ``sequence_logprobs`` (completion at the end)."""
    out = torch.zeros(len(rows), T)
    for i, r in enumerate(rows):
        if r:
            out[i, T - len(r) :] = torch.tensor(r, dtype=torch.float32)
    return out
