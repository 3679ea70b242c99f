"""One optimiser update's gradient in several forward/backward passes (gradient accumulation), exactly.

A mini-batch's loss is not a sum of per-row terms with fixed weights: token-mean divides by the
mini-batch's token count, HACPO clips by mini-batch, PRP and the KL term normalise over their own
rows. Scaling each micro-batch's loss by its share, as is usual, is exact for some of those and not
for others. So we split the chain rule instead (docs/algorithms.md §7.2): the loss depends on the
weights only through the learner's per-token log-probs ℓ,

    ∂L/∂θ = Σ_{i,t} (∂L/∂ℓ_it) · ∂ℓ_it/∂θ,

and ∂L/∂ℓ is cheap once ℓ is known. Every loss we have is *row-local*: row i's ∂L/∂ℓ_i depends on
ℓ_i and on data (advantages, masks, the sampler's log-probs, normalisers that count tokens or rows),
never on another row's ℓ. Then one pass suffices (``accumulate_one_pass``): each micro-batch's ℓ with
its graph goes into a [b, T] leaf whose other rows hold any finite stand-in, the mode's loss runs on
that leaf, and the leaf's gradient at the micro-batch's rows is exactly its g; ``Σ ℓ·g`` goes back
through the micro-batch's graph. A mode that pools ℓ across rows declares it
(``SharingMode.row_local_loss``) and gets two passes instead: pass 1 computes ℓ for every micro-batch
without a graph and the loss's backward gives g; pass 2 runs each micro-batch again with a graph and
back-propagates ``Σ ℓ·g`` — one extra gradient-free forward (about a third of a forward+backward).
Either way the update equals the whole-batch one (to float rounding) and activation memory is one
micro-batch's.

Rows are bucketed by length (prompt + completion) so a micro-batch pads little: the loss sees the
mini-batch in its own order, so the order the passes take does not matter.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from mutualrl.models.generation import sequence_logprobs


def plan_micro_batches(lengths: list[int], max_rows: int | None = None,
                       max_tokens: int | None = None) -> list[list[int]]:
    """Rows of a mini-batch (by index) grouped into forward/backward passes: sorted by length, each
    pass at most ``max_rows`` rows and at most ``max_tokens`` padded tokens (rows × its longest row);
    a row longer than ``max_tokens`` goes alone. Without bounds: one pass of every row, in order."""
    if not lengths:
        return []
    if max_rows is None and max_tokens is None:
        return [list(range(len(lengths)))]
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    plan: list[list[int]] = [[]]
    for i in order:
        cur = plan[-1]
        width = max([lengths[j] for j in cur] + [lengths[i]])
        full = (max_rows is not None and len(cur) >= max_rows) or (
            max_tokens is not None and cur and width * (len(cur) + 1) > max_tokens)
        if full:
            plan.append([i])
        else:
            cur.append(i)
    return plan


@dataclass
class LearnerForward:
    """How the learner computes its log-probs: the model, its pad id, the sampling temperature,
    and the precision's autocast context (``context()``; a no-op in fp32)."""
    model: torch.nn.Module
    pad_id: int
    temperature: float = 1.0
    context: Callable[[], contextlib.AbstractContextManager] = field(default=contextlib.nullcontext)
    share_prompts: bool = False  # rows sharing a prompt share its forward (algorithm.share_prompt_forward)

    def logprobs(self, prompts: list[list[int]], completions: list[list[int]],
                 model: torch.nn.Module | None = None) -> torch.Tensor:
        """[b, T] log-probs (fp32) of the completions, right-aligned; a graph when grad is enabled."""
        with self.context():
            logp, _ = sequence_logprobs(model if model is not None else self.model, prompts, completions,
                                        pad_id=self.pad_id, temperature=self.temperature,
                                        share_prompts=self.share_prompts)
        return logp

    def logprobs_no_grad(self, prompts: list[list[int]], completions: list[list[int]], plan: list[list[int]],
                         model: torch.nn.Module | None = None) -> torch.Tensor:
        """Pass 1: [b, T] log-probs of the whole mini-batch, computed micro-batch by micro-batch without a
        graph (T: its longest completion)."""
        T = max(len(c) for c in completions)
        out: torch.Tensor | None = None
        with torch.no_grad():
            for idx in plan:
                part = self.logprobs([prompts[i] for i in idx], [completions[i] for i in idx], model)
                if out is None:
                    out = part.new_zeros((len(completions), T))
                out[idx, T - part.shape[1]:] = part
        assert out is not None
        return out

    def backward_through(self, prompts: list[list[int]], completions: list[list[int]], plan: list[list[int]],
                         grad_logp: torch.Tensor) -> None:
        """Pass 2: each micro-batch's log-probs again, with a graph, back-propagating ``Σ ℓ · g`` so the
        parameters' gradients accumulate ∂L/∂θ (``grad_logp``: g = ∂L/∂ℓ, [b, T] right-aligned)."""
        T = grad_logp.shape[1]
        for idx in plan:
            part = self.logprobs([prompts[i] for i in idx], [completions[i] for i in idx])
            g = grad_logp[idx, T - part.shape[1]:].to(part.device)
            (part * g).sum().backward()

    def accumulate_one_pass(self, prompts: list[list[int]], completions: list[list[int]], plan: list[list[int]],
                            stand_in: torch.Tensor,
                            loss_of: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """One pass per micro-batch for a row-local loss (module docstring): the micro-batch's log-probs with a
        graph, placed into ``stand_in`` ([b, T] right-aligned, finite: the sampler's log-probs) as a leaf; the
        leaf's gradient under ``loss_of`` at those rows is their ∂L/∂ℓ, back-propagated through the graph. Returns
        the mini-batch's log-probs without a graph, laid out as ``logprobs_no_grad`` lays them out."""
        T = stand_in.shape[1]
        full = stand_in.new_zeros(stand_in.shape)
        for idx in plan:
            part = self.logprobs([prompts[i] for i in idx], [completions[i] for i in idx])
            cols = slice(T - part.shape[1], T)
            leaf = stand_in.detach().clone()
            leaf[idx, cols] = part.detach().to(leaf.dtype)
            leaf.requires_grad_(True)
            loss = loss_of(leaf)
            if loss.requires_grad:
                loss.backward()
            if leaf.grad is not None and part.requires_grad:
                (part * leaf.grad[idx, cols].to(part.device)).sum().backward()
            full[idx, cols] = part.detach().to(full.dtype)
        return full
