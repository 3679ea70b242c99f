"""Deploy checks need tools `make test-deploy` installs (promtool, prometheus, docker-compose,
hadolint, helm-python-sdk); they are marked `deploy` and run only there."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "mutualrl"


def pytest_collection_modifyitems(items):
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.deploy)
