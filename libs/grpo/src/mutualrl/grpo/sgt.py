"""Success-Gated Transfer: verified peer successes as a rescue set (docs/algorithms.md §3.3 SGT).

The rescue loss ascends ``log π_n(y*|x)``, a lower bound of the log success
probability ``log p_n(x)`` (§3.4), exactly on prompts where the learner's own
group found no success — the support gap GRPO cannot close (all-fail groups
have zero advantage).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mutualrl.grpo.advantages import grpo_advantages


@dataclass(frozen=True)
class RescueItem:
    """One candidate: a peer's verified success, already in the receiver's token ids."""

    prompt_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    source_policy: str
    message_id: str
    text: str = ""  # the peer's completion as text (SGT-R shows it as a hint)


def select_rescues(
    candidates: list[RescueItem],
    own_successes: dict[str, int],
    group_size: int,
    gate_tau: float = 0.0,
    max_per_prompt: int = 1,
    shortest_first: bool = True,
) -> list[RescueItem]:
    """The rescue set ``R_n`` (§3.3): keep candidates whose prompt's own success count is
    ``<= τ·G`` (τ=0: only all-fail groups), at most ``K_r`` per prompt, shortest first (or, without
    ``shortest_first``, in message order: no preference for a bare answer's few tokens).

    Prompts the learner did not sample this step (absent from ``own_successes``) are
    not gated open: the gate is a statement about the learner's own group.
    Ties in length break by message id so the choice is deterministic.
    """
    threshold = gate_tau * group_size
    by_prompt: dict[str, list[RescueItem]] = {}
    for c in candidates:
        if c.prompt_id in own_successes and own_successes[c.prompt_id] <= threshold:
            by_prompt.setdefault(c.prompt_id, []).append(c)
    chosen: list[RescueItem] = []
    seen: set[tuple[int, ...]] = set()
    for pid in sorted(by_prompt):
        items = sorted(by_prompt[pid], key=lambda c: (len(c.token_ids) if shortest_first else 0, c.message_id))
        kept = 0
        for c in items:
            key = (hash(pid), *c.token_ids)
            if key in seen:
                continue  # the same completion from two peers counts once
            seen.add(key)
            chosen.append(c)
            kept += 1
            if kept >= max_per_prompt:
                break
    return chosen


SGT_GUARDS = ("none", "chord", "luffy")
"""Per-token style guards on SGT's NLL (§3.3): none, CHORD's p(1−p), LUFFY's p/(p+γ)."""


def sgt_token_weights(logp: torch.Tensor, guard: str, gamma: float = 0.1) -> torch.Tensor:
    """Detached per-token weights φ of the rescue NLL (§3.3), from the receiver's own probability p = π_n(y*_t | ·):
    ``none`` 1; ``chord`` p(1−p) (a token the receiver finds nearly impossible — a foreign answer form — or already
    certain weighs ~0); ``luffy`` p/(p+γ) (small where p ≪ γ, ~1 where the receiver agrees)."""
    if guard == "none":
        return torch.ones_like(logp)
    p = logp.detach().exp()
    if guard == "chord":
        return p * (1.0 - p)
    if guard == "luffy":
        return p / (p + gamma)
    raise ValueError(f"unknown SGT guard {guard!r}; valid: {', '.join(SGT_GUARDS)}")


def sgt_nll(logp: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """``mean_{(x,y*)∈R_n}[ −(1/|y*|_n) Σ_t φ_t log π_n(y*_t | x, y*_<t) ]`` (§3.3), φ = 1 unless a guard's
    ``weights`` (detached, :func:`sgt_token_weights`) are given.

    logp [R, T] log-probs of the rescue completions under the learner; mask [R, T].
    Returns a scalar (0 with a graph when R is empty).
    """
    if logp.shape[0] == 0:
        return logp.sum() * 0.0
    m = mask.to(logp.dtype)
    phi = m if weights is None else m * weights.detach()
    per_seq = -(logp * phi).sum(-1) / m.sum(-1).clamp(min=1.0)  # [R]
    return per_seq.mean()


def group_insert_advantages(
    own_rewards: torch.Tensor,
    own_group_ids: torch.Tensor,
    rescue_group_ids: torch.Tensor,
    *,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGT "group insert" variant (§3.3): each rescue ``y*`` joins its prompt's group with
    reward 1 and the GRPO advantage is recomputed over the enlarged group, so ``y*`` gets
    ``Â > 0`` and the own failures ``Â < 0``. The caller applies ratio := 1 to the inserted
    rows (no importance sampling, LUFFY-style guidance).

    own_rewards [B], own_group_ids [B], rescue_group_ids [R] -> (own_adv [B], rescue_adv [R]).
    """
    rewards = torch.cat([own_rewards.float(), torch.ones(rescue_group_ids.shape[0])])
    groups = torch.cat([own_group_ids, rescue_group_ids.to(own_group_ids.dtype)])
    adv = grpo_advantages(rewards, groups, norm_by_std=norm_by_std, epsilon=epsilon)
    return adv[: own_rewards.shape[0]], adv[own_rewards.shape[0] :]
