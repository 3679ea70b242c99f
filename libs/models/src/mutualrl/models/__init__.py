"""Policies without a hub: tiny models of several families, tokenizers trained on the fly.

Everything here also loads real Hugging Face models and tokenizers from a local
path (or a hub name when online) through the same code, so a config can swap a
tiny built policy for a real checkpoint without touching the training loop.
"""

from mutualrl.models.families import FAMILIES, build_model
from mutualrl.models.policy import PolicyArtifacts, encode_completion, encode_prompt, load_policy
from mutualrl.models.tokenizers import TOKENIZER_KINDS, build_tokenizer, load_tokenizer

__all__ = [
    "TOKENIZER_KINDS",
    "FAMILIES",
    "build_tokenizer",
    "load_tokenizer",
    "build_model",
    "PolicyArtifacts",
    "load_policy",
    "encode_prompt",
    "encode_completion",
]
