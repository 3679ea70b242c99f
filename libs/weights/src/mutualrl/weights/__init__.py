"""Versioned policy weights shared between a learner and its rollout engines (a library:
the learner writes, rollout services read; neither imports the other)."""

from mutualrl.weights.store import WeightStore, verify_checksum
from mutualrl.weights.transport import (
    COLLECTIVE_SCHEME,
    CollectiveReceiver,
    CollectiveSender,
    GroupChannel,
    StreamingReceiver,
    TensorManifest,
    WeightReceiver,
    WeightSender,
    collective_uri,
    hf_receiver,
    hf_sender,
    parse_collective_uri,
    tensor_checksum,
    weight_group,
)

__all__ = ["COLLECTIVE_SCHEME", "CollectiveReceiver", "CollectiveSender", "GroupChannel", "TensorManifest",
           "StreamingReceiver", "WeightReceiver", "WeightSender", "WeightStore", "collective_uri", "hf_receiver",
           "hf_sender",
           "parse_collective_uri", "tensor_checksum", "verify_checksum", "weight_group"]
