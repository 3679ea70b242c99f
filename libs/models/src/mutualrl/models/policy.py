"""Load a policy (model + tokenizer) from a built spec or a local path, with a disk cache.

Built policies are cached by a content hash of everything that determines them
(family, shape, tokenizer kind and size, the corpus fingerprint, the seed), so a
second run, or a test session, reuses the same artifacts instead of retraining
tokenizers — and any change to those inputs gets a fresh entry automatically.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from mutualrl.models.cache import atomic_dir, default_cache_dir
from mutualrl.models.families import ModelShape, build_model
from mutualrl.models.production import qwen25_task_tokenizer, qwen25_tokenizer
from mutualrl.models.tokenizers import BUILDER_VERSIONS, build_tokenizer, load_tokenizer

CACHE_VERSION = "2"


@dataclass
class PolicyArtifacts:
    """A loaded policy: model, tokenizer, and the fingerprints that key caches and peers' conversions."""
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: str  # "built:<hash>" or the local path it was loaded from
    fingerprint: str  # tokenizer fingerprint carried on every message (THL keys on it)

    @property
    def num_params(self) -> int:
        """The model's parameter count."""
        return sum(p.numel() for p in self.model.parameters())


def context_limit(config) -> int | None:
    """The longest prompt + completion a model takes (its position embeddings), or None when its config says none."""
    n = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return int(n) if n else None


def tokenizer_fingerprint(tok: PreTrainedTokenizerBase) -> str:
    """Hash of the vocabulary: equal fingerprints mean ids are interchangeable."""
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:20]


PRODUCTION_KIND = "qwen2.5"  # a production vocabulary (151,646 tokens), rebuilt offline, not trained
PRODUCTION_TASK_KIND = "qwen2.5-task"  # the same, trimmed to the tokens that spell the task's text


def load_policy(
    *,
    path: str | None = None,
    family: str | None = None,
    shape: ModelShape | None = None,
    tokenizer_path: str | None = None,
    tokenizer_kind: str | None = None,
    vocab_size: int = 300,
    corpus: Callable[[], list[str]] | None = None,
    corpus_fingerprint: str = "",
    seed: int = 0,
    cache_dir: Path | None = None,
    dtype: torch.dtype = torch.float32,
) -> PolicyArtifacts:
    """Return model and tokenizer for one policy.

    Either ``path`` (a Hugging Face model directory or hub name) or ``family`` (a
    tiny model built here) must be given. The tokenizer comes from
    ``tokenizer_path``, else ``path``, else is trained (``tokenizer_kind``) on
    ``corpus()``.
    """
    if bool(path) == bool(family):
        raise ValueError("a policy needs exactly one of a model path or a model family")
    if path and Path(path).exists() and not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(f"model path {path} has no config.json")
    tok, tok_key = policy_tokenizer(path, tokenizer_path, tokenizer_kind, vocab_size, corpus, corpus_fingerprint,
                                    cache_dir)

    if path:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        source = str(path)
    else:
        assert family is not None
        shape = shape or ModelShape()
        ids = {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
        model = build_model(family, len(tok), shape, ids, seed=seed)
        if dtype != torch.float32:  # model.dtype bfloat16/float16: built in fp32 (its seeded init), then cast
            model.to(dtype)
        source = "built:" + _digest([CACHE_VERSION, family, asdict(shape), tok_key, seed])
    if model.get_input_embeddings().num_embeddings < len(tok):
        raise ValueError(f"model vocabulary ({model.get_input_embeddings().num_embeddings}) is smaller than the "
                         f"tokenizer's ({len(tok)})")
    model.generation_config.pad_token_id = tok.pad_token_id
    disable_dropout(model)
    return PolicyArtifacts(model=model, tokenizer=tok, source=source, fingerprint=tokenizer_fingerprint(tok))


def policy_tokenizer(
    path: str | None = None,
    tokenizer_path: str | None = None,
    tokenizer_kind: str | None = None,
    vocab_size: int = 300,
    corpus: Callable[[], list[str]] | None = None,
    corpus_fingerprint: str = "",
    cache_dir: Path | None = None,
) -> tuple[PreTrainedTokenizerBase, object]:
    """A policy's tokenizer alone, and the key that identifies it: what a learner needs of its
    peers (their tokenizers, to carry their text through THL) without loading their models."""
    if tokenizer_path:
        where = str(Path(tokenizer_path).resolve()) if Path(tokenizer_path).exists() else tokenizer_path
        return load_tokenizer(tokenizer_path), ("path", where)
    if path:
        return load_tokenizer(path), ("path", path)
    if tokenizer_kind == PRODUCTION_KIND:

        return qwen25_tokenizer(cache_dir), ("production", PRODUCTION_KIND)
    if tokenizer_kind == PRODUCTION_TASK_KIND:
        if corpus is None:
            raise ValueError("tokenizer kind qwen2.5-task needs the task corpus (its characters are the alphabet kept)")

        tok = qwen25_task_tokenizer({c for text in corpus() for c in text}, cache_dir)
        return tok, ("production", PRODUCTION_TASK_KIND, tokenizer_fingerprint(tok))
    if not tokenizer_kind or corpus is None:
        raise ValueError("a built policy needs a tokenizer kind and a corpus (or a tokenizer path)")
    return _cached_tokenizer(tokenizer_kind, vocab_size, corpus, corpus_fingerprint, cache_dir)


def _cached_tokenizer(kind: str, vocab_size: int, corpus: Callable[[], list[str]], corpus_fp: str,
                      cache_dir: Path | None):
    key = _digest([CACHE_VERSION, "tokenizer", kind, vocab_size,
                   corpus_fp] + ([BUILDER_VERSIONS[kind]] if kind in BUILDER_VERSIONS else []))
    entry = (cache_dir or default_cache_dir()) / "tokenizers" / key
    if not (entry / "tokenizer.json").is_file() or not corpus_fp:
        tok = build_tokenizer(kind, corpus(), vocab_size)
        if corpus_fp:
            atomic_dir(entry, lambda d: tok.save_pretrained(d))
        return tok, ("built", key)
    return load_tokenizer(entry), ("built", key)


def disable_dropout(model: torch.nn.Module) -> None:
    """RL needs the learner's log-probs to equal the sampler's: with dropout active in the
    learner's train-mode forward, the first on-policy PPO ratio is already != 1 and clips
    spuriously (GPT-2 configs default to p=0.1). verl and TRL disable it likewise."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    for attr in ("attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout", "dropout"):
        if isinstance(getattr(model.config, attr, None), float):
            setattr(model.config, attr, 0.0)


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """``model.gradient_checkpointing``: recompute each block in the backward pass, non-reentrant (so the blocks'
    own saved-tensor hooks nest inside mutualrl.models.weight_casts'). transformers 5 names the switch
    ``activation_checkpointing_enable``; the releases before it (the project allows ≥ 4.56) have only
    ``gradient_checkpointing_enable``."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


COMPLETION_TEMPLATE = "{instruction}Question: {prompt}\nAnswer:"
"""How a pretrained model without a chat template (a base model) is prompted: a completion it continues."""
COMPLETION_STOPS = ("\n\n", "\nQuestion:")
"""Where a base model's answer ends when nothing else is set: it goes on to the next question otherwise."""


@dataclass(frozen=True)
class PromptStyle:
    """How a policy is shown a task's prompt, and where its answer ends.

    Three forms (docs/algorithms.md §5.3):
    - **chat**: the tokenizer's chat template, the instruction after the task text in the user turn
      (SmolLM2-135M-Instruct follows it there and not as a system message: greedy 62 % against 38 % on
      one-digit sums);
    - **completion**: ``completion_template`` with the task text (and the instruction as a first paragraph)
      for a pretrained model without a template — a base model continues "Question: …\nAnswer:" and
      talks nonsense in a chat format;
    - **bare**: the task text alone, as built models are trained on it.

    ``chat_template``: True/False forces chat or not; None uses the template when the tokenizer has one,
    else the completion form when ``completion_template`` is set, else bare. ``stop``: strings that end
    a completion (the text is cut before the first, the tokens after the token that completes it);
    None: ``COMPLETION_STOPS`` in completion form, none otherwise."""

    chat_template: bool | None = None
    instruction: str = ""
    completion_template: str | None = None
    stop: tuple[str, ...] | None = None

    def uses_template(self, tok: PreTrainedTokenizerBase) -> bool:
        """Whether prompts go through ``tok``'s chat template (``chat_template``; None: when it has one)."""
        return bool(getattr(tok, "chat_template", None)) if self.chat_template is None else self.chat_template

    def form(self, tok: PreTrainedTokenizerBase) -> str:
        """``chat``, ``completion`` or ``bare`` for this tokenizer."""
        if self.uses_template(tok):
            return "chat"
        return "completion" if self.completion_template else "bare"

    def stops(self, tok: PreTrainedTokenizerBase) -> tuple[str, ...]:
        """The stop strings that apply with this tokenizer."""
        if self.stop is not None:
            return tuple(self.stop)
        return COMPLETION_STOPS if self.form(tok) == "completion" else ()

    def messages(self, text: str) -> list[dict]:
        """The chat messages of a prompt: one user turn, the task's instruction after the text."""
        return [{"role": "user", "content": f"{text}\n\n{self.instruction}" if self.instruction else text}]

    def completion_text(self, text: str) -> str:
        """The completion-form prompt of ``text``."""
        assert self.completion_template is not None
        block = f"{self.instruction}\n\n" if self.instruction else ""
        return self.completion_template.format(prompt=text, instruction=block)


def encode_prompt(tok: PreTrainedTokenizerBase, text: str, style: PromptStyle | None = None) -> list[int]:
    """Prompt ids as the policy is fed them: ``apply_chat_template`` of the style's messages with
    the generation prompt when the template is used, the completion template's text in completion
    form, else the plain text; with the tokenizer's specials."""
    style = style or PromptStyle()
    form = style.form(tok)
    if form == "chat":
        ids = tok.apply_chat_template(style.messages(text), add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    if form == "completion":
        return tok(style.completion_text(text), add_special_tokens=True)["input_ids"]
    return tok(text, add_special_tokens=True)["input_ids"]


def encode_completion(tok: PreTrainedTokenizerBase, text: str, add_eos: bool = True) -> list[int]:
    """A completion's token ids without special tokens, ending with EOS unless ``add_eos`` is false."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return ids + [tok.eos_token_id] if add_eos else ids
