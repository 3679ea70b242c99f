"""SGT-R: a peer's verified success as a hint; the receiver learns from completions it wrote itself
(docs/algorithms.md §3.5, our design).

The receiver samples k completions of prompt x with a hint h (the peer's text, its answer masked) in its context;
the verifier scores them; the verified ones train the receiver *under the hint-free prompt x*. Three pure pieces:

- :func:`hint_weights` — each rescued token's detached weight toward the hint-free policy,
  ``w_t = clip(π_θ(y_t | x, y_<t) / π_b(y_t | x, h, y_<t), w_min, w_max)``, with π_θ at the start of the step.
  The floor ``w_min > 0`` is what lets a receiver learn a form it never writes without the hint (Guide's floor of 0
  removes exactly those tokens); the cap bounds the variance, as truncated IS does.
- :func:`rescue_advantages` — ``Â_i = max(r_i − b_g, 0) / (σ_g + ε)``: the baseline ``b_g`` is the receiver's own
  group mean on x (its hint-free value estimate), σ_g the spread of the group enlarged by the rescues. Only
  verified rescues push; a rescue that failed *with* a hint says nothing about the hint-free policy. The own rows'
  advantages are those of isolated GRPO — an all-fail group's stay 0, never pushed down by the rescues beside it.
- :func:`hint_fraction` — how much of the peer's text the hint shows, shrinking over steps (QuestA's schedule) so
  that what is learned is the receiver's own continuation (the text itself is cut in ``mutualrl.tasks.hints``).
"""

from __future__ import annotations

import math

import torch

from mutualrl.grpo.advantages import group_stats
from mutualrl.grpo.gspo import sequence_mean
from mutualrl.grpo.policy_loss import masked_mean


def hint_weights(hint_free_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, *,
                 w_min: float, w_max: float, sequence_level: bool = False) -> tuple[torch.Tensor, dict]:
    """Detached weights of rescued tokens toward the hint-free policy (§3.5).

    hint_free_logp [B, T]: the receiver's log-probs of the rescued tokens under the plain prompt at the start of the
    step; behaviour_logp [B, T]: the hinted sampling's; mask [B, T]. Token losses get ``w`` [B, T] =
    ``clip(exp(hint_free − behaviour), w_min, w_max)``; a sequence-level loss (GSPO) one weight per row [B] from the
    length-normalised log-ratio. Metrics: the mean weight and the fractions at the floor and at the cap."""
    if not 0.0 <= w_min <= 1.0 <= w_max:
        raise ValueError(f"hint weights need 0 <= w_min <= 1 <= w_max (got {w_min}, {w_max})")
    log_w = (hint_free_logp - behaviour_logp).detach()
    where = mask
    if sequence_level:
        log_w = sequence_mean(log_w, mask)  # [B]
        where = (mask.sum(-1) > 0).float()
    lo = math.log(w_min) if w_min > 0 else -math.inf
    floored, capped = log_w < lo, log_w > math.log(w_max)
    w = log_w.exp().clamp(min=w_min, max=w_max)
    return w, {"hint_weight_mean": masked_mean(w, where, empty=1.0),
               "hint_floored_frac": masked_mean(floored.float(), where),
               "hint_capped_frac": masked_mean(capped.float(), where)}


def rescue_advantages(own_rewards: torch.Tensor, own_groups: torch.Tensor, rescue_rewards: torch.Tensor,
                      rescue_groups: torch.Tensor, *, norm_by_std: bool = True, epsilon: float = 1e-6) -> torch.Tensor:
    """Advantages of rescued rows [R]: ``max(r_i − b_g, 0) / (σ_g + ε)`` (§3.5), ``b_g`` the mean of group g's own
    rewards, ``σ_g`` the unbiased std of its own rewards and these rescue rows' together — the rows that join a step,
    those above ``b_g`` (without ``norm_by_std``: Dr.GRPO's unscaled difference). A group with no own rows has
    ``b_g = 0``.

    own_rewards [N], own_groups [N], rescue_rewards [R], rescue_groups [R] (group labels shared by both)."""
    if rescue_rewards.numel() == 0:
        return torch.zeros(0)
    r_res = rescue_rewards.float()
    baseline = torch.zeros_like(r_res)
    for i, g in enumerate(rescue_groups.tolist()):
        own = own_rewards[own_groups == g].float()
        baseline[i] = own.mean() if own.numel() else 0.0
    adv = (r_res - baseline).clamp(min=0.0)
    if not norm_by_std:
        return adv
    rewards = torch.cat([own_rewards.float(), r_res])
    groups = torch.cat([own_groups, rescue_groups.to(own_groups.dtype)])
    _, std, _ = group_stats(rewards, groups)
    return adv / (std[own_rewards.shape[0]:] + epsilon)


def hint_fraction(step: int, start: float, end: float, steps: int) -> float:
    """The share of the peer's text a hint shows at ``step``: ``start`` at step 1, linearly to ``end`` over
    ``steps`` steps, ``end`` after (``steps`` 0: ``start`` throughout)."""
    if steps <= 0:
        return start
    t = min(1.0, max(0, step - 1) / steps)
    return start + (end - start) * t
