"""The real pretrained model for the tests that need it: SmolLM2-135M-Instruct, converted once per
machine from the packaged GGUF (into ~/.cache/mutualrl/models, or MUTUALRL_MODELS_TEST_CACHE), so
test sessions after the first take it from there instead of converting again (~35 s, 540 MB)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PRESET = "smollm2-135m-instruct"


def models_cache() -> Path:
    return Path(os.environ.get("MUTUALRL_MODELS_TEST_CACHE", Path.home() / ".cache" / "mutualrl"))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    pytest.importorskip("gguf", reason="the real extra (pip install '.[real]'; make test installs it)")
    from mutualrl.models.pretrained import get_model

    return get_model(PRESET, models_cache())


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    from mutualrl.models import load_tokenizer

    return load_tokenizer(smollm2_dir)
