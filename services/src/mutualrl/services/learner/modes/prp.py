"""``prp``: peer rollout pooling — a pooled group, recomputed advantages, a truncated density
ratio on peer rows and THL's residual gate (docs/algorithms.md §3.3 PRP)."""

from __future__ import annotations

from typing_extensions import override

from mutualrl.grpo import PolicyLossOutput, prp_peer_loss
from mutualrl.services.learner.modes.base import SharingMode, register_mode
from mutualrl.services.learner.objective import PEER, LossInputs


@register_mode
class PeerRolloutPooling(SharingMode):
    """Pooled group; peer rows weighted by a truncated density ratio (settings: ``sharing.prp``)."""

    name = "prp"
    section = "§3.3 PRP"
    peer_kinds = ("rollout",)

    @override
    def peer_loss(self, x: LossInputs) -> PolicyLossOutput | None:
        peer = x.kind == PEER
        if not peer.any():
            return None
        p = self.sh.prp
        out = prp_peer_loss(x.logp[peer], x.mask[peer], x.advantages[peer], peer_logp=x.logprobs[peer],
                            peer_mean_logp=x.source_mean_logprob[peer],
                            level=p.ratio_level, truncation=p.truncation, loss_agg=self.a.loss_agg,
                            norm_len=self.norm_len)
        return PolicyLossOutput(p.weight * out.loss, out.metrics)
