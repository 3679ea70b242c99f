"""A tiny llama policy behind a real ``HFEngine`` with a weight store: what the rollout server's tests serve."""

from __future__ import annotations

from pathlib import Path

from mutualrl.models import load_policy
from mutualrl.models.families import ModelShape
from mutualrl.services.rollout import HFEngine
from mutualrl.tasks import build_task
from mutualrl.weights import WeightStore


def tiny_engine(weights_dir: Path, *, max_positions: int, seed: int, train_size: int, eval_size: int):
    """(artifacts, store, engine) of a 2-layer char-tokenised llama trained on nothing yet."""
    task = build_task("arithmetic", seed=0, min_digits=1, max_digits=2, train_size=train_size, eval_size=eval_size)
    shape = ModelShape(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_positions=max_positions)
    arts = load_policy(family="llama", shape=shape, tokenizer_kind="char", corpus=task.corpus,
                       corpus_fingerprint=task.fingerprint(), seed=seed)
    store = WeightStore(weights_dir)
    engine = HFEngine(arts.model, eos_id=arts.tokenizer.eos_token_id, pad_id=arts.tokenizer.pad_token_id, store=store)
    return arts, store, engine
