"""The ``shared`` weight transport of `mutualrl run`: the engine samples the learner's own module.

In one process with synchronous sampling (``async.max_staleness: 0``) a policy's rollouts for step t are
sampled after its learner finished step t−1 and published it, and before step t's update starts: at every
sampling the engine must serve exactly the learner's current weights. Sharing the module gives that with no
copy at all — TRL samples with the trained module the same way — where the ``filesystem`` store in memory
kept a copy of each of the last versions and the engine a copy of its own (for the 630 M-parameter
Qwen2.5-Coder, 7.5 GB of the 24 GB that two real models had). A version is still numbered, announced and
acknowledged through the handshake, so the records, the metrics and a follower's bookkeeping are the same;
its URI names no tensors. Pipelined sampling (k > 0) needs the older weights while the learner moves on,
and keeps the copying transports.
"""

from __future__ import annotations

import torch

from mutualrl.weights.transport import Announce, TensorManifest

SHARED_SCHEME = "shared://"


def shared_uri(policy: str, version: int) -> str:
    """The URI of a version served from the learner's own module."""
    return f"{SHARED_SCHEME}{policy}/{version}"


class SharedModelSender:
    """Announces each version; writes and copies nothing (the engine holds the same module)."""

    root = None  # not a directory: a vLLM or SGLang server cannot use it

    def publish(self, policy: str, version: int, state: dict[str, torch.Tensor], announce: Announce,
                model_config=None) -> tuple[str, str]:
        """Announce ``version`` of ``policy``; its tensors are the learner's module as it is now."""
        uri = shared_uri(policy, version)
        announce(uri, "", None)
        return uri, ""

    def get(self, uri: str, checksum: str | None = None,
            manifest: TensorManifest | None = None) -> dict[str, torch.Tensor]:
        """A shared version has no tensors to read: only an engine built on the learner's module serves it."""
        raise ValueError(f"{uri} is served from the learner's own module; this engine holds a copy of its own")

    def acknowledge(self, policy: str, version: int) -> None:
        """Nothing is kept per version."""
