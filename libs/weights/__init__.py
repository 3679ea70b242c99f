"""Versioned policy weights shared between a learner and its rollout engines (a library:
the learner writes, rollout services read; neither imports the other)."""

from mutualrl.weights.store import WeightStore, verify_checksum

__all__ = ["WeightStore", "verify_checksum"]
