"""Where built tokenizers, converted models and warm starts are cached, and how an entry is written
so that concurrent or killed runs never see half of one."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def default_cache_dir() -> Path:
    """``$MUTUALRL_CACHE``, else ``~/.cache/mutualrl`` (tests point it at a session directory)."""
    return Path(os.environ.get("MUTUALRL_CACHE", Path.home() / ".cache" / "mutualrl"))


def atomic_dir(final: Path, write: Callable[[Path], None]) -> None:
    """Write a cache entry into a temporary folder beside ``final``, then rename it into place (a
    second writer that lost the race keeps the first one's entry)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".tmp-"))
    try:
        write(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
