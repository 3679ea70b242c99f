"""Losses, advantages and sharing modes as pure functions over tensors (no I/O).

Every function cites the formula it implements in ``docs/algorithms.md``
(section numbers below refer to that file). Shapes: ``B`` rows (completions),
``T`` completion tokens, ``G`` group size, ``M`` peers.
"""

from mutualrl.grpo.advantages import group_stats, grpo_advantages
from mutualrl.grpo.aggregation import LOSS_AGG_MODES, agg_loss
from mutualrl.grpo.decoupled import (
    SEQUENCE_LEVEL_LOSSES,
    behaviour_weights,
    decoupled_policy_loss,
    sequence_behaviour_weights,
)
from mutualrl.grpo.gspo import gspo_loss, gspo_token_loss, sequence_mean, sequence_ratio
from mutualrl.grpo.hacpo import CAPABILITY_METRICS, CapabilityTracker, cross_clip_lower, hacpo_advantages, hacpo_loss
from mutualrl.grpo.hinted import hint_fraction, hint_weights, rescue_advantages
from mutualrl.grpo.kl import KL_ESTIMATORS, kl_penalty
from mutualrl.grpo.policy_loss import POLICY_LOSSES, PolicyLossOutput, get_policy_loss, ppo_clip_loss
from mutualrl.grpo.prp import PRP_RATIO_LEVELS, prp_peer_loss
from mutualrl.grpo.sgt import (
    SGT_GUARDS,
    RescueItem,
    group_insert_advantages,
    select_rescues,
    sgt_nll,
    sgt_token_weights,
)
from mutualrl.grpo.xgrpo import XGRPO_VARIANTS, PeerGroupStats, xgrpo_advantages, xgrpo_baseline

__all__ = [
    "grpo_advantages",
    "group_stats",
    "SEQUENCE_LEVEL_LOSSES",
    "behaviour_weights",
    "decoupled_policy_loss",
    "sequence_behaviour_weights",
    "LOSS_AGG_MODES",
    "agg_loss",
    "gspo_loss",
    "gspo_token_loss",
    "sequence_mean",
    "sequence_ratio",
    "CAPABILITY_METRICS",
    "CapabilityTracker",
    "cross_clip_lower",
    "hacpo_advantages",
    "hacpo_loss",
    "hint_fraction",
    "hint_weights",
    "rescue_advantages",
    "KL_ESTIMATORS",
    "kl_penalty",
    "POLICY_LOSSES",
    "PolicyLossOutput",
    "get_policy_loss",
    "ppo_clip_loss",
    "PRP_RATIO_LEVELS",
    "prp_peer_loss",
    "RescueItem",
    "group_insert_advantages",
    "select_rescues",
    "sgt_nll",
    "SGT_GUARDS",
    "sgt_token_weights",
    "XGRPO_VARIANTS",
    "PeerGroupStats",
    "xgrpo_advantages",
    "xgrpo_baseline",
]
