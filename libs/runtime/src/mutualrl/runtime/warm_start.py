"""Supervised warm start so RL has signal, cached on disk by content hash.

Tiny random models never sample a correct answer, and GRPO gives zero advantage
to all-fail groups; a short SFT pass on reference answers lifts held-out
accuracy into a range where RL (and sharing) has something to work with. The
pass stops as soon as a check reaches ``target_accuracy`` — a fixed step count
is unreliable because accuracy jumps abruptly (measured on the demo models).

The check runs on a *validation* slice carved from the training split, never on
the held-out problems RL is evaluated on: stopping at the first check that
crosses the target selects an upward fluctuation, and if that check were the
held-out set the reported warm-start accuracy would be inflated and every RL
gain measured from it understated (regression to the mean; docs/algorithms.md §5.1).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mutualrl.config.schema import WarmStartConfig
from mutualrl.models.generation import sequence_logprobs
from mutualrl.models.policy import PromptStyle, encode_completion, encode_prompt
from mutualrl.runtime.evaluation import greedy_accuracy
from mutualrl.tasks import Problem, Verifier


@dataclass
class WarmStartResult:
    """How a warm start ended: steps taken, validation accuracy, and whether it came from the cache."""
    steps: int
    accuracy: float
    seconds: float
    cached: bool


def _key(source: str, cfg: WarmStartConfig, task_fp: str, seed: int, max_new_tokens: int) -> str:
    blob = json.dumps([source, cfg.model_dump(), task_fp, seed, max_new_tokens, "ws3"], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def split_validation(train: list[Problem], size: int) -> tuple[list[Problem], list[Problem]]:
    """(SFT problems, validation problems): the last ``size`` training problems — at most a
    fifth of the split, at least one — are held back from SFT to decide when it stops."""
    if len(train) < 2:
        raise ValueError("warm start needs at least 2 training problems to hold one back for validation; "
                         f"the task has {len(train)}")
    n = max(1, min(size, len(train) // 5))
    return train[:-n], train[-n:]


def warm_start(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    train: list[Problem],
    verifier: Verifier,
    cfg: WarmStartConfig,
    *,
    source: str,
    task_fingerprint: str,
    seed: int,
    max_new_tokens: int,
    cache_dir: Path,
    prompt_style: PromptStyle | None = None,
    on_progress: Callable[[int, float], None] | None = None,
) -> WarmStartResult:
    """Supervised steps on the task's answers until held-back validation reaches the target (or the step budget); cached
    by content hash."""
    entry = cache_dir / "warm" / _key(source, cfg, task_fingerprint, seed, max_new_tokens)
    locks = cache_dir / "warm-locks"  # beside the entries, so the cache holds nothing but them
    locks.mkdir(parents=True, exist_ok=True)
    # one starting point is trained once: a second process wanting it (two jobs of a compare on one
    # pair) waits for the first to finish and loads its result instead of training it again
    with _exclusive(locks / f"{entry.name}.lock"):
        if (entry / "model.safetensors").is_file() and (entry / "meta.json").is_file():
            model.load_state_dict(load_file(str(entry / "model.safetensors")), strict=False)
            meta = json.loads((entry / "meta.json").read_text())
            return WarmStartResult(meta["steps"], meta["accuracy"], 0.0, cached=True)
        return _train(model, tok, train, verifier, cfg, entry, seed, max_new_tokens, prompt_style, on_progress)


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``lock_path`` for the duration (released if the holder dies)."""
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _train(model: PreTrainedModel, tok: PreTrainedTokenizerBase, train: list[Problem], verifier: Verifier,
           cfg: WarmStartConfig, entry: Path,
           seed: int, max_new_tokens: int, prompt_style: PromptStyle | None,
           on_progress: Callable[[int, float], None] | None) -> WarmStartResult:
    t0 = time.monotonic()
    rng = random.Random(f"warm:{seed}")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    train, validation = split_validation(train, cfg.eval_size)
    acc = greedy_accuracy(model, tok, validation, verifier, max_new_tokens, prompt_style=prompt_style)
    step = 0
    while step < cfg.max_steps and acc < cfg.target_accuracy:
        model.train()
        batch = rng.sample(train, min(cfg.batch_size, len(train)))
        prompts = [encode_prompt(tok, p.prompt, prompt_style) for p in batch]
        answers = [encode_completion(tok, p.answer) for p in batch]
        logp, mask = sequence_logprobs(model, prompts, answers, pad_id=tok.pad_token_id)
        loss = -(logp.sum() / mask.sum())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % cfg.check_every == 0 or step == cfg.max_steps:
            acc = greedy_accuracy(model, tok, validation, verifier, max_new_tokens, prompt_style=prompt_style)
            if on_progress:
                on_progress(step, acc)
    model.eval()
    entry.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(entry / "model.safetensors"))
    (entry / "meta.json").write_text(json.dumps({"steps": step, "accuracy": acc}))
    return WarmStartResult(step, acc, time.monotonic() - t0, cached=False)
