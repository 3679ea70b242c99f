"""Versioned policy weights shared between a learner and its rollout engines (a library:
the learner writes, rollout services read; neither imports the other)."""

from mutualrl.weights.store import WeightStore, verify_checksum
from mutualrl.weights.transport import CollectiveTransport, WeightTransport, tensor_checksum, weight_group

__all__ = ["CollectiveTransport", "WeightStore", "WeightTransport", "tensor_checksum", "verify_checksum", "weight_group"]
