"""Randomly initialised causal LMs of several families, sized by a few numbers.

The families differ where it matters for heterogeneity: Llama and Qwen2 use
RoPE, RMSNorm and SwiGLU (Qwen2 adds QKV bias and grouped KV heads), GPT-2 uses
learned absolute positions, LayerNorm and GELU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)


@dataclass(frozen=True)
class ModelShape:
    """The size of a model built here: width, depth, heads, MLP width, context."""
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 512
    max_positions: int = 128


def _decoder_config(vocab: int, s: ModelShape, ids: dict[str, int], kv_heads: int) -> dict:
    """The config fields Llama and Qwen2 name alike (tied embeddings: a small vocabulary's model stays small)."""
    return dict(vocab_size=vocab, hidden_size=s.hidden_size, intermediate_size=s.intermediate_size,
                num_hidden_layers=s.num_layers, num_attention_heads=s.num_heads, num_key_value_heads=kv_heads,
                max_position_embeddings=s.max_positions, tie_word_embeddings=True, **ids)


def _llama(vocab: int, s: ModelShape, ids: dict[str, int]) -> PreTrainedModel:
    return LlamaForCausalLM(LlamaConfig(**_decoder_config(vocab, s, ids, kv_heads=s.num_heads)))


def _qwen2(vocab: int, s: ModelShape, ids: dict[str, int]) -> PreTrainedModel:
    kv = max(1, s.num_heads // 2)  # grouped-query attention, as the Qwen2 family uses
    kv_heads = kv if s.num_heads % kv == 0 else s.num_heads
    return Qwen2ForCausalLM(Qwen2Config(**_decoder_config(vocab, s, ids, kv_heads=kv_heads)))


def _gpt2(vocab: int, s: ModelShape, ids: dict[str, int]) -> PreTrainedModel:
    cfg = GPT2Config(vocab_size=vocab, n_embd=s.hidden_size, n_layer=s.num_layers, n_head=s.num_heads,
                     n_inner=s.intermediate_size, n_positions=s.max_positions,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ids)  # no dropout: RL wants exact log-probs
    return GPT2LMHeadModel(cfg)


FAMILIES: dict[str, Callable[[int, ModelShape, dict[str, int]], PreTrainedModel]] = {
    "llama": _llama,
    "qwen2": _qwen2,
    "gpt2": _gpt2,
}


def build_model(family: str, vocab_size: int, shape: ModelShape, special_ids: dict[str, int],
                seed: int = 0) -> PreTrainedModel:
    """A freshly initialised model; the same (family, shape, seed) gives the same weights."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; valid: {', '.join(sorted(FAMILIES))}")
    if shape.hidden_size % shape.num_heads:
        raise ValueError(f"hidden_size {shape.hidden_size} is not divisible by num_heads {shape.num_heads}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = FAMILIES[family](vocab_size, shape, special_ids)
    return model
