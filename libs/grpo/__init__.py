"""Losses, advantages and sharing modes as pure functions over tensors (no I/O).

Every function cites the formula it implements in ``shared/algorithms.md``
(section numbers below refer to that file). Shapes: ``B`` rows (completions),
``T`` completion tokens, ``G`` group size.
"""

from mutualrl.grpo.advantages import ADVANTAGE_ESTIMATORS, get_advantage_estimator, grpo_advantages, group_stats
from mutualrl.grpo.kl import kl_penalty
from mutualrl.grpo.aggregation import LOSS_AGG_MODES, agg_loss
from mutualrl.grpo.policy_loss import POLICY_LOSSES, PolicyLossOutput, get_policy_loss, ppo_clip_loss
from mutualrl.grpo.sgt import RescueItem, select_rescues, sgt_nll

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "get_advantage_estimator",
    "grpo_advantages",
    "group_stats",
    "kl_penalty",
    "LOSS_AGG_MODES",
    "agg_loss",
    "POLICY_LOSSES",
    "PolicyLossOutput",
    "get_policy_loss",
    "ppo_clip_loss",
    "RescueItem",
    "select_rescues",
    "sgt_nll",
]
