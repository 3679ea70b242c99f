"""`mutualrl models get` the first time, as a new user meets it: from an environment without `gguf` and
`accelerate`. It used to install them and then fail ("accelerate is required when loading a GGUF file")
because transformers, imported before the install, had already decided accelerate was absent; the same
command run again succeeded. The conversion now runs in a fresh interpreter.

The environment is a real venv: the project's packages are linked into a folder it reads, all but gguf and
accelerate, so the command installs those two for real (from PyPI or pip's cache) into the new venv."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

HIDDEN = ("gguf", "accelerate")


def _fresh_env(tmp_path: Path) -> Path:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    site = Path(sysconfig.get_paths()["purelib"])
    linked = tmp_path / "project-site"
    linked.mkdir()
    for entry in site.iterdir():
        if not entry.name.lower().startswith(HIDDEN):
            (linked / entry.name).symlink_to(entry)
    new_site = next((env_dir / "lib").glob("python*/site-packages"))
    # processed like a site directory (its .pth files too: the editable install of mutualrl)
    (new_site / "zz-project.pth").write_text(f"import site; site.addsitedir({str(linked)!r})\n")
    return env_dir / "bin" / "python"


@pytest.mark.slow
@pytest.mark.parametrize("preset, extra", [("smollm2-135m-instruct", []), ("qwen2.5-coder-0.5b-instruct", []),
                                           ("gemma-3-270m", ["--accept-license"])])
def test_models_get_succeeds_the_first_time_in_an_env_without_gguf_and_accelerate(tmp_path, preset, extra):
    python = _fresh_env(tmp_path)
    missing = subprocess.run([str(python), "-c", "import importlib.util as u; print([u.find_spec(m) is None for m in "
                              f"{HIDDEN!r}])"], capture_output=True, text=True, timeout=120)
    assert missing.stdout.strip() == "[True, True]", missing.stderr[-2000:]
    env = {**os.environ, "MUTUALRL_CACHE": str(tmp_path / "cache")}
    p = subprocess.run([str(python), "-m", "mutualrl.app.cli", "models", "get", preset, *extra],
                       capture_output=True, text=True, timeout=1800, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "installing gguf" in p.stderr and "accelerate is required" not in p.stderr
    folder = Path(p.stdout.strip().splitlines()[-1])
    assert folder == tmp_path / "cache" / "models" / preset
    assert (folder / "model.safetensors").is_file() and (folder / "mutualrl-model.json").is_file()
    now = subprocess.run([str(python), "-c", "import gguf, accelerate; print(gguf.__file__)"], capture_output=True,
                         text=True, timeout=120)
    assert now.returncode == 0 and str(tmp_path / "venv") in now.stdout  # installed into the new venv, for real
    assert sys.executable != str(python)
