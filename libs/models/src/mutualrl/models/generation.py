"""Batched sampling with exact per-token log-probabilities, and batched scoring.

We sample with our own KV-cached loop rather than ``model.generate`` so that the
returned log-probs are exactly ``log_softmax`` of the distribution the token was
drawn from (after temperature and top-k/top-p), with no hidden generation-config
defaults (transformers defaults ``top_k`` to 50). These are the behaviour
log-probs ``log π_old`` of docs/algorithms.md §1.1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel


@dataclass
class Sample:
    """One sampled completion: its token ids, per-token log-probs and why it stopped."""
    token_ids: list[int]  # completion ids, EOS included when the sample ended on it
    logprobs: list[float]  # one per token id
    finish_reason: str  # "stop" (EOS) or "length"


def _pad(seqs: list[list[int]], pad_id: int, device: torch.device, *, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B, width] and their attention mask, each sequence against the right edge (``left`` padding: a
    prompt, whose next token follows its last) or the left one (a completion continuing a cached prompt)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
    for i, s in enumerate(seqs):
        if s:
            span = slice(width - len(s), width) if left else slice(0, len(s))
            ids[i, span] = torch.tensor(s, dtype=torch.long, device=device)
            mask[i, span] = 1
    return ids, mask


def _distinct_prompts(prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts, in order of first appearance, and each row's index among them (a GRPO group's rows
    share one prompt: :func:`_prefill` and :func:`_shared_prompt_logprobs` run each distinct one once)."""
    index: dict[tuple[int, ...], int] = {}
    row_of = [index.setdefault(tuple(p), len(index)) for p in prompts]
    return [list(p) for p in index], row_of


def _filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k and top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix with mass >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


def sample_categorical(logp: torch.Tensor, generator: torch.Generator | None = None,
                       u: torch.Tensor | None = None) -> torch.Tensor:
    """One draw per row from ``softmax(logp)`` ([B, V] -> [B]) by inverting the CDF: one uniform
    ``u`` per row, the first token whose float64 cumulative probability exceeds ``u·Σp``. A token
    of probability 0 (filtered by top-k/top-p) is never drawn: its cumulative sum does not rise.
    ``torch.multinomial`` (and an exponential race) draw a random number per vocabulary entry: on
    the CPU at a 151k vocabulary and 256 rows that was 0.8 s per token against 0.25 s here.
    ``u`` [B, 1] float64 in [0, 1): the uniforms to use (drawn from ``generator`` when None)."""
    cdf = logp.double().exp_().cumsum_(-1)  # [B, V]
    if u is None:
        u = torch.rand(cdf.shape[0], 1, generator=generator, dtype=torch.float64, device=cdf.device)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)


def cut_at_stop(decode: Callable[[list[int]], str], s: Sample,
                stops: tuple[str, ...] | list[str]) -> tuple[Sample, str]:
    """A completion cut at its first stop string: the text before the stop string (what is scored and
    published), and the sample's tokens up to and including the token that completes it, with their
    behaviour log-probs unchanged. The kept tokens are exactly the sampled ones, so the learner trains on
    what was sampled (the stop included: it learns to end); a stop string that ends inside a token keeps
    that whole token. A completion without a stop string is returned as it is.

    ``decode``: token ids to text (the tokenizer's, without special tokens)."""
    text = decode(s.token_ids)
    hits = [(i, stop) for stop in stops if stop and (i := text.find(stop)) >= 0]
    if not hits:
        return s, text
    start, stop = min(hits)
    end = start + len(stop)
    lo, hi = 1, len(s.token_ids)  # the fewest tokens whose text reaches the stop string's end
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(s.token_ids[:mid])) >= end:
            hi = mid
        else:
            lo = mid + 1
    return Sample(s.token_ids[:lo], s.logprobs[:lo], "stop"), text[:start]


class GenerationCancelled(RuntimeError):
    """The caller of a generation went away before it finished."""


COMPACT_AT = 0.25
"""Finished rows leave the generation batch (their KV cache rows dropped) once they are this share of it:
each forward then runs on the rows still generating. Compacting on every finish would copy the cache more
often than it saves; a quarter keeps the copies few (at most ~log(B)/log(4/3) per generation)."""


@torch.no_grad()
def sample(
    model: PreTrainedModel,
    prompts: list[list[int]],
    *,
    eos_id: int,
    pad_id: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    should_stop: Callable[[], bool] | None = None,
    compact: bool = True,
    stop: StopStrings | None = None,
    share_prefill: bool = True,
) -> list[Sample]:
    """One completion per prompt (repeat a prompt for a group). ``temperature=0`` is greedy.
    ``should_stop`` is asked before every token: a caller that went away (a cancelled RPC, a
    passed deadline) stops the generation with :class:`GenerationCancelled` instead of holding
    the model for the rest of it. ``compact``: finished rows leave the batch (``COMPACT_AT``); every
    row draws from the same uniform stream either way, so a seed gives the same samples up to the
    float rounding of a smaller batch's matmuls. ``stop`` (:func:`stop_string_check`): whether a row's
    completion so far holds a stop string; the row ends at the token that completes it (finish reason
    "stop"), as :func:`cut_at_stop` would cut it afterwards, instead of generating what would be cut.
    ``share_prefill``: a prompt repeated across rows (a GRPO group) is prefilled once and its KV cache
    copied to each of its rows (:func:`_prefill`)."""
    if not prompts:
        return []
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        toks, lps, ends = _generate(model, prompts, device, eos_id, pad_id, max_new_tokens, temperature, top_k,
                                    top_p, generator, should_stop, compact, stop, share_prefill)
    finally:
        if was_training:
            model.train()
    samples = []
    for i, (row_t, row_l) in enumerate(zip(toks.tolist(), lps.tolist())):
        if i in ends:  # ended by a stop string
            samples.append(Sample(row_t[: ends[i]], row_l[: ends[i]], "stop"))
        elif eos_id in row_t:
            n = row_t.index(eos_id) + 1
            samples.append(Sample(row_t[:n], row_l[:n], "stop"))
        else:
            samples.append(Sample(row_t, row_l, "length"))
    return samples


def _prefill(model, prompts: list[list[int]], pad_id: int, device, share: bool):
    """The prompts' forward pass: (KV cache, next-token logits [B, V] fp32, attention mask, position ids).

    The rows of a GRPO group share one prompt, and a prompt's forward does not depend on the other rows, so
    with ``share`` each distinct prompt is computed once and its cache, logits, mask and positions copied to its
    rows: 1/group of the prefill's work, which is a third of a 32-row × 48-token generation of SmolLM2 on a CPU.
    The distinct prompts are left-padded to the same width as the whole batch would be (the longest prompt is
    among them), so every row gets what the whole batch's prefill would have given it. A cache that cannot copy
    rows (no ``batch_select_indices``) gets the whole batch's prefill instead."""
    distinct, row_of = _distinct_prompts(prompts) if share else (prompts, [])
    shared = len(distinct) < len(prompts)
    ids, mask = _pad(distinct if shared else prompts, pad_id, device, left=True)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    # the prefill needs the next-token logits of the last position only: at a 151k vocabulary the
    # LM head over every prompt position would cost more than the rest of the model
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    past, logits = out.past_key_values, out.logits[:, -1, :].float()
    if not shared:
        return past, logits, mask, pos
    if not hasattr(past, "batch_select_indices"):
        return _prefill(model, prompts, pad_id, device, share=False)
    rows = torch.tensor(row_of, device=device)
    past.batch_select_indices(rows)
    return past, logits[rows], mask[rows], pos[rows]


def _generate(model, prompts, device, eos_id, pad_id, max_new_tokens, temperature, top_k, top_p, generator,
              should_stop, compact, stop=None, share_prefill=True) -> tuple[torch.Tensor, torch.Tensor, dict[int, int]]:
    """The KV-cached loop of :func:`sample`: [B, n] token ids (pad after EOS or a stop string), their log-probs,
    and the length of each row a stop string ended."""
    past, logits, mask, pos = _prefill(model, prompts, pad_id, device, share_prefill)
    B = len(prompts)
    toks = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)
    lps = torch.zeros((B, max_new_tokens), dtype=torch.float32, device=device)
    rows = torch.arange(B, device=device)  # the original row of each row still in the batch
    done = torch.zeros(B, dtype=torch.bool, device=device)
    next_pos = pos[:, -1]
    n = 0
    ends: dict[int, int] = {}
    for t in range(max_new_tokens):
        if should_stop is not None and should_stop():
            raise GenerationCancelled("generation stopped: the caller cancelled or its deadline passed")
        if temperature == 0:
            logp = F.log_softmax(logits, dim=-1)
            tok = logp.argmax(-1)
        else:  # the whole batch's uniforms, each row taking its own: the stream does not depend on compaction
            u = torch.rand(B, 1, generator=generator, dtype=torch.float64, device=device)[rows]
            logp = F.log_softmax(_filter_logits(logits / temperature, top_k, top_p), dim=-1)
            tok = sample_categorical(logp, u=u)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        toks[rows, t] = tok
        lps[rows, t] = logp.gather(-1, tok[:, None]).squeeze(-1)
        n = t + 1
        done = done | (tok == eos_id)
        if stop is not None:
            _end_at_stop_strings(stop, toks, rows, done, t, ends)
        finished = int(done.sum())  # the token's one host read: whether to stop, and whether to compact
        if finished == len(rows):
            break
        if compact and past is not None and hasattr(past, "batch_select_indices"):
            if finished and finished >= COMPACT_AT * len(rows):
                keep = (~done).nonzero().squeeze(-1)
                past.batch_select_indices(keep)
                rows, tok, mask, next_pos, done = rows[keep], tok[keep], mask[keep], next_pos[keep], done[keep]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        next_pos = next_pos + 1
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None], past_key_values=past,
                    use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1, :].float()
    return toks[:, :n], lps[:, :n], ends


def _end_at_stop_strings(stop: StopStrings, toks: torch.Tensor, rows: torch.Tensor, done: torch.Tensor, t: int,
                         ends: dict[int, int]) -> None:
    """Mark done (in place) the rows still generating whose completion now holds a stop string, and record each
    one's length (``t + 1`` tokens) under its original row. Only the last ``stop.window`` tokens of each row are
    read back: the whole history every token would cost O(T²) host copies."""
    active = (~done).nonzero().squeeze(-1)
    if not len(active):
        return
    tails = toks[rows[active], max(0, t + 1 - stop.window): t + 1].tolist()
    hit = [i for i, ids in zip(active.tolist(), tails) if stop(ids)]
    for i in hit:
        ends[int(rows[i])] = t + 1
    if hit:
        done[torch.tensor(hit, device=done.device)] = True


def text_decoder(tok) -> Callable[[list[int]], str]:
    """Token ids to a completion's text as it is scored and cut: the tokenizer's decode without special tokens
    and without clean-up (which would change the text the stop strings and verifiers read)."""
    return lambda ids: tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


@dataclass(frozen=True)
class StopStrings:
    """``stop`` for :func:`sample`: whether a completion so far holds one of ``stops``, where :func:`cut_at_stop`
    would cut it. Asked after every token, a stop string is seen at the token that completes it, so only the last
    ``window`` tokens are decoded (a string of L characters spans at most L tokens; two more for tokens that are
    parts of a character). While another stop string that starts earlier may still complete, the row goes on:
    the cut is at the earliest start, as on the whole completion."""
    decode: Callable[[list[int]], str]
    stops: tuple[str, ...]

    @property
    def window(self) -> int:
        """How many of a completion's last tokens the check reads."""
        return max(len(x) for x in self.stops) + 2

    def __call__(self, ids: list[int]) -> bool:
        """Whether the completion ``ids`` (its last ``window`` tokens suffice) ends here."""
        tail = self.decode(ids[-self.window:])
        found = [i for x in self.stops if (i := tail.find(x)) >= 0]
        if not found:
            return False
        first = min(found)
        return not any(x.startswith(tail[j:]) for x in self.stops
                       for j in range(max(0, len(tail) - len(x) + 1), first))


def stop_string_check(decode: Callable[[list[int]], str], stops: tuple[str, ...] | list[str]) -> StopStrings | None:
    """The :class:`StopStrings` check of ``stops`` (None without any: nothing to end a row at)."""
    stops = tuple(x for x in stops if x)
    return StopStrings(decode, stops) if stops else None


class _SelectiveLogprobs(torch.autograd.Function):
    """log_softmax(x)[target] with a hand-written backward, both chunked over rows, so neither
    pass holds more than one chunk of float32 vocabulary-wide activations: the forward keeps
    only the per-row logsumexp; the backward writes ``g · (onehot(target) − softmax(x))``
    straight into the logits' gradient, chunk by chunk."""

    @staticmethod
    def forward(ctx, flat: torch.Tensor, idx: torch.Tensor, chunk_rows: int) -> torch.Tensor:
        lse = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
        for i in range(0, flat.shape[0], chunk_rows):
            lse[i : i + chunk_rows] = torch.logsumexp(flat[i : i + chunk_rows].float(), dim=-1)
        picked = flat.gather(-1, idx[:, None]).squeeze(-1).float()
        ctx.save_for_backward(flat, idx, lse)
        ctx.chunk_rows = chunk_rows
        return picked - lse

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        flat, idx, lse = ctx.saved_tensors
        out = torch.empty_like(flat)
        rows = torch.arange(flat.shape[0], device=flat.device)
        for i in range(0, flat.shape[0], ctx.chunk_rows):
            sl = slice(i, i + ctx.chunk_rows)
            g = grad[sl].float()[:, None]
            chunk = torch.exp(flat[sl].float() - lse[sl, None]).mul_(-g)  # −g·softmax
            chunk[rows[sl] - i, idx[sl]] += g.squeeze(-1)  # + g at the target
            out[sl] = chunk.to(flat.dtype)
        return out, None, None


def selective_logprobs(logits: torch.Tensor, targets: torch.Tensor, chunk_rows: int = 256) -> torch.Tensor:
    """``log_softmax(logits)[..., target]`` without materialising the full-vocabulary
    log-softmax: the target's logit minus a logsumexp computed (in float32) over chunks of
    ``chunk_rows`` positions, with a backward chunked the same way. At a 151k vocabulary and
    64×512 tokens the full log-softmax alone is ~20 GB of float32; this keeps one chunk's worth
    beyond the logits and their gradient. Exact up to float rounding, gradients too.

    ``logits [..., V]`` (any float dtype), ``targets [...]`` -> float32 ``[...]``.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    if flat.shape[0] == 0:
        return logits.new_zeros(targets.shape, dtype=torch.float32)
    return _SelectiveLogprobs.apply(flat, targets.reshape(-1), chunk_rows).reshape(targets.shape)


def sequence_logprobs(
    model: PreTrainedModel,
    prompts: list[list[int]],
    completions: list[list[int]],
    *,
    pad_id: int,
    temperature: float = 1.0,
    share_prompts: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log π(y_t | x, y_<t) for each completion, right-aligned into a padded batch.

    ``temperature``: the distribution the sampler drew from, ``softmax(logits / T)``
    (docs/algorithms.md §1.1): the learner's π_θ must be the same function as the behaviour π_old,
    or the PPO ratio is off 1 on-policy at any T ≠ 1. T = 0 (greedy) and T = 1 leave the logits as
    they are.

    Returns ``logprobs [B, T]`` and ``mask [B, T]`` (1 on completion tokens),
    where T is the longest completion. Gradients flow (the learner's hot path).
    ``share_prompts``: rows that share a prompt (a GRPO group) share its forward pass
    (:func:`_shared_prompt_logprobs`); the same function to float rounding, not bit for bit.
    """
    if len(prompts) != len(completions):
        raise ValueError("prompts and completions differ in length")
    if share_prompts and all(completions):
        distinct, row_of = _distinct_prompts(prompts)
        if len(distinct) < len(prompts):
            shared = _shared_prompt_logprobs(model, distinct, row_of, completions, pad_id, temperature)
            if shared is not None:
                return shared
    device = next(model.parameters()).device
    seqs = [p + c for p, c in zip(prompts, completions)]
    T = max(len(c) for c in completions)
    ids, attn = _pad(seqs, pad_id, device, left=True)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    # logits at position j predict token j+1: positions L-T-1 .. L-2 cover every completion token,
    # so the LM head runs on those alone (most of the cost at a production vocabulary), and the
    # logits come out contiguous (a sliced view would be copied again to flatten it)
    L = ids.shape[1]
    keep = torch.arange(L - T - 1, L - 1, device=device)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=keep).logits  # [B, T, V]
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    targets = ids[:, -T:]  # [B, T]
    logp = selective_logprobs(logits, targets)  # [B, T]
    mask = torch.zeros_like(targets, dtype=torch.float32)
    for i, c in enumerate(completions):
        if c:
            mask[i, T - len(c) :] = 1.0
    return logp * mask, mask


def _shared_prompt_logprobs(model: PreTrainedModel, distinct: list[list[int]], row_of: list[int],
                            completions: list[list[int]], pad_id: int,
                            temperature: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`sequence_logprobs` with one forward pass per distinct prompt (docs/algorithms.md §7.2); row i's prompt
    is ``distinct[row_of[i]]`` (:func:`_distinct_prompts`).

    A prompt's hidden states do not depend on what follows it (causal attention), so the G rows of a group need its
    forward once: the distinct prompts run with a KV cache (left-padded), the cache is copied to each row, and the
    completions run on it (right-padded, positions continuing the prompt's). Gradients flow through the copies, so
    each prompt position's gradient is the sum over its rows, as in the whole forward. The first completion token's
    log-prob comes from the prompt's last position. At 4 prompts × 8 rows of ~55 prompt tokens and ≤ 48 completion
    tokens this computes ~40 % of the tokens of the whole forward. None when the cache cannot copy rows, or under
    gradient checkpointing (which turns the cache off)."""
    if torch.is_grad_enabled() and _checkpointing(model):
        return None
    device = next(model.parameters()).device
    rows = torch.tensor(row_of, device=device)
    p_ids, p_mask = _pad(distinct, pad_id, device, left=True)
    p_pos = (p_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=p_ids, attention_mask=p_mask, position_ids=p_pos, use_cache=True, logits_to_keep=1)
    past = out.past_key_values
    if not hasattr(past, "batch_select_indices"):
        return None
    past.batch_select_indices(rows)
    c_ids, c_mask = _pad(completions, pad_id, device, left=False)
    T = c_ids.shape[1]
    lengths = c_mask.sum(-1)
    c_pos = p_pos[rows, -1:] + 1 + torch.arange(T, device=device)[None, :]
    # positions 0..T-2 of the completions predict tokens 1..T-1; token 0 comes from the prompt's last position
    first = out.logits[:, -1:, :][rows]  # [B, 1, V]
    if T > 1:
        rest = model(input_ids=c_ids, attention_mask=torch.cat([p_mask[rows], c_mask], dim=-1), position_ids=c_pos,
                     past_key_values=past, use_cache=False,
                     logits_to_keep=torch.arange(0, T - 1, device=device)).logits  # [B, T-1, V]
        logits = torch.cat([first, rest], dim=1)
    else:
        logits = first
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp_left = selective_logprobs(logits, c_ids)  # [B, T], completion at the start
    # right-align as sequence_logprobs does: row i's token k sits at column T - len_i + k
    col = torch.arange(T, device=device)[None, :] - (T - lengths[:, None])
    mask = (col >= 0).float()
    logp = logp_left.gather(1, col.clamp(min=0)) * mask
    return logp, mask


def _checkpointing(model: PreTrainedModel) -> bool:
    """Whether activation checkpointing is on: ``is_activation_checkpointing`` in recent transformers,
    ``is_gradient_checkpointing`` (deprecated there) before (the project allows ≥ 4.56)."""
    if hasattr(type(model), "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))
