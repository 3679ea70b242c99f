"""Shared test setup: offline hub, a session-wide artifact cache, two torch threads."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(2)

from hypothesis import settings  # noqa: E402

# CI replays the same examples every run (a red CI always means a regression); local runs
# draw new examples each time, which is how edge cases get found.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session", autouse=True)
def _artifact_cache(tmp_path_factory):
    """Built tokenizers and warm starts are cached by content hash; share them across the session.

    CI may point MUTUALRL_CACHE at a persistent directory to skip rebuilding between runs.
    """
    if "MUTUALRL_TEST_CACHE" in os.environ:
        os.environ["MUTUALRL_CACHE"] = os.environ["MUTUALRL_TEST_CACHE"]
    else:
        os.environ["MUTUALRL_CACHE"] = str(tmp_path_factory.mktemp("mutualrl-cache"))
    yield


@pytest.fixture(scope="session")
def load_script():
    """Import a repository script by its path from the root (``tools/…``, ``benchmarks/…``): they are run as files,
    not installed as packages, and their tests import them this way."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]

    def load(relpath: str):
        spec = importlib.util.spec_from_file_location(Path(relpath).stem, root / relpath)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="session")
def arithmetic_task():
    from mutualrl.tasks import build_task

    return build_task("arithmetic", seed=0, min_digits=1, max_digits=2, train_size=5000, eval_size=128)


@pytest.fixture(scope="session")
def tokenizers(arithmetic_task):
    from mutualrl.models import build_tokenizer

    corpus = arithmetic_task.corpus()
    return {kind: build_tokenizer(kind, corpus, 300) for kind in ("char", "bpe", "bpe-digits", "unigram")}


@pytest.fixture(scope="session")
def redis_server():
    """A real Redis-compatible server on a free loopback port for the whole session, stopped by pid."""
    from mutualrl.see.server import RedisServer

    server = RedisServer().start()
    yield server
    server.cleanup()
