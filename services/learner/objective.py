"""The data a step's objective is built from: its training rows (own rollouts, peer rows,
rescues) and their advantages. Which formula applies to which row is each sharing mode's
strategy (:mod:`mutualrl.services.learner.strategies`); the formulas live in ``libs/grpo``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

OWN, PEER, RESCUE = 0, 1, 2
"""Row kinds: the learner's own rollout, a peer's (THL-converted) rollout, an SGT rescue."""


@dataclass
class Rows:
    """A step's training rows in the order they are trained (own first, self-first for HACPO)."""

    prompt_ids: list[list[int]] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    old_logp: list[list[float]] = field(default_factory=list)  # behaviour log-probs on the learner's tokens
    mask: list[list[float]] = field(default_factory=list)  # tokens that enter the loss
    reward: list[float] = field(default_factory=list)
    prompt_id: list[str] = field(default_factory=list)
    source: list[str] = field(default_factory=list)  # producing policy
    kind: list[int] = field(default_factory=list)
    source_mean_logp: list[float] = field(default_factory=list)  # ℓ̄ of the behaviour policy in its own tokens

    def add(self, *, prompt_ids, completion_ids, old_logp, mask, reward, prompt_id, source, kind, source_mean_logp) -> None:
        if not (len(completion_ids) == len(old_logp) == len(mask)):
            raise ValueError(f"row of {len(completion_ids)} tokens has {len(old_logp)} log-probs and {len(mask)} mask entries")
        self.prompt_ids.append(list(prompt_ids))
        self.completion_ids.append(list(completion_ids))
        self.old_logp.append(list(old_logp))
        self.mask.append(list(mask))
        self.reward.append(float(reward))
        self.prompt_id.append(prompt_id)
        self.source.append(source)
        self.kind.append(kind)
        self.source_mean_logp.append(float(source_mean_logp))

    def __len__(self) -> int:
        return len(self.reward)

    def count(self, kind: int) -> int:
        return sum(1 for k in self.kind if k == kind)


@dataclass
class StepAdvantages:
    """The advantages of one step's rows, with the statistics the metrics report."""
    advantages: torch.Tensor  # [N]
    omega: torch.Tensor  # [N], HACPO's ω on cross rows (1 elsewhere)
    metrics: dict[str, float] = field(default_factory=dict)


def right_aligned(rows: list[list[float]], T: int) -> torch.Tensor:
    """Per-token lists into a [B, T] tensor aligned like ``sequence_logprobs`` (completion at the end)."""
    out = torch.zeros(len(rows), T)
    for i, r in enumerate(rows):
        if r:
            out[i, T - len(r) :] = torch.tensor(r, dtype=torch.float32)
    return out
