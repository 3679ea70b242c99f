"""Whether a text can sit in a policy's prompt as plain text: it spells back exactly through the policy's tokenizer,
and it names none of the tokenizer's control tokens (a peer's hint that contained ``<|im_end|>`` would close the
user's turn when the chat-templated prompt is encoded, and could open a system message of its own)."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


def control_texts(tok: PreTrainedTokenizerBase) -> list[str]:
    """The strings the tokenizer turns into control tokens when it meets them in text: its special tokens and its
    added tokens marked special, longest first."""
    texts = set(getattr(tok, "all_special_tokens", []) or [])
    for added in (getattr(tok, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            texts.add(str(added.content))
    return sorted((t for t in texts if t), key=len, reverse=True)


def control_text_in(tok: PreTrainedTokenizerBase, text: str) -> str | None:
    """The first control-token string ``text`` contains, or None."""
    return next((t for t in control_texts(tok) if t in text), None)


def spells(tok: PreTrainedTokenizerBase, text: str) -> bool:
    """Whether ``text`` encodes and decodes back to itself through ``tok`` (no unknown tokens, nothing normalised
    away)."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    unk = getattr(tok, "unk_token_id", None)
    if unk is not None and unk in ids:
        return False
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) == text
