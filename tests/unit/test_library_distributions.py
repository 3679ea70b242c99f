"""THL and the GRPO library install alone: each folder's own ``pyproject.toml`` builds a wheel
holding only its part of the ``mutualrl`` namespace, and that wheel works without the rest of the
project (the editable install of the whole project is taken out of the import system first)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

USE = {  # a use of each library, then proof that the rest of mutualrl is not there
    "thl": "from mutualrl.thl import ThlBudget, convert\nassert ThlBudget().max_unaligned >= 0\n",
    "grpo": "import torch\nfrom mutualrl.grpo import grpo_advantages\n"
            "a = grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]))\n"
            "assert a.tolist()[2:] == [0.0, 0.0] and a[0] > 0 > a[1]\n",
}
ALONE = ("try:\n    import mutualrl.tasks\nexcept ImportError:\n    pass\n"
         "else:\n    raise SystemExit('the rest of mutualrl is still importable')\n")


@pytest.mark.parametrize("lib", ["thl", "grpo"])
def test_a_library_builds_and_works_alone(lib, tmp_path):
    # a build leaves files beside the source: build a copy
    src = shutil.copytree(ROOT / "libs" / lib, tmp_path / lib, ignore=shutil.ignore_patterns("__pycache__"))
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path),
             str(src)]
    subprocess.run(build, check=True, capture_output=True)
    (wheel,) = tmp_path.glob(f"mutualrl_{lib}-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    code = [n for n in names if n.endswith(".py")]
    assert code and all(n.startswith(f"mutualrl/{lib}/") for n in code), code  # its own modules, no namespace __init__
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path\n"
        "                    if 'editable' not in type(f).__module__ and 'editable' not in repr(f)]\n"
        "sys.path_hooks[:] = [h for h in sys.path_hooks if 'editable' not in repr(h)]\n"
        "sys.path[:] = [p for p in sys.path if '__editable__' not in p]\n"
        "sys.path_importer_cache.clear()\n"
        f"sys.path.insert(0, {str(site)!r})\n"
        f"import mutualrl.{lib} as lib\n"
        f"assert lib.__file__.startswith({str(site)!r}), lib.__file__\n"
    )
    probe += USE[lib] + ALONE
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
