"""Every file under examples/ loads: an experiment validates against the schema, a compare spec finds its
pairs and its entries' overrides validate on each pair."""

from pathlib import Path

import pytest
import yaml

from mutualrl.app.compare import CompareSpec
from mutualrl.config import load_config

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "examples").rglob("*.yaml"))


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT / "examples")) for p in FILES])
def test_every_example_loads(path):
    raw = yaml.safe_load(path.read_text())
    if "entries" in raw:  # a compare spec
        spec = CompareSpec.load(path)
        for pair, file in spec.pairs.items():
            for entry, sets in spec.entries.items():
                load_config(file, list(sets), check_paths=False)
        assert spec.runs()
    else:
        cfg = load_config(path, check_paths=False)
        assert cfg.policies
