"""checkov over the chart as every CI values file renders it: no failed check, and each chart-wide skip in
deploy/helm/checkov-skips.yaml says why it does not apply (a skip for one object is an annotation on it)."""

from __future__ import annotations

import json
import shutil
import subprocess

import helm_python
import yaml
from conftest import CHART, ROOT

SKIPS = yaml.safe_load((ROOT / "deploy" / "helm" / "checkov-skips.yaml").read_text())


def checkov() -> str:
    path = shutil.which("checkov") or str(ROOT / ".venv-checkov" / "bin" / "checkov")
    assert shutil.which(path), "checkov is not installed: run `make test-deploy`, which installs it"
    return path


def test_every_skip_gives_its_reason():
    assert SKIPS and all(k.startswith("CKV_K8S_") and len(str(v).split()) >= 8 for k, v in SKIPS.items()), SKIPS


def test_the_rendered_chart_passes_checkov(tmp_path):
    chart = helm_python.Chart.load(CHART)
    for values in sorted((CHART / "ci").glob("*-values.yaml")):
        out = chart.render(yaml.safe_load(values.read_text()), name="rl", namespace="ml", is_install=True)
        d = tmp_path / values.stem
        d.mkdir()
        for name, text in out.items():
            if name.endswith(".yaml") and text.strip():
                (d / name.rsplit("/", 1)[-1]).write_text(text)
    p = subprocess.run([checkov(), "-d", str(tmp_path), "--framework", "kubernetes", "--quiet", "--compact", "-o",
                        "json", "--skip-check", ",".join(SKIPS)], capture_output=True, text=True, timeout=600)
    reports = json.loads(p.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [(f["check_id"], f["resource"], f["file_path"]) for r in reports for f in r["results"]["failed_checks"]]
    assert not failed, failed
    assert sum(r["summary"]["passed"] for r in reports) > 500
    assert sum(r["summary"]["skipped"] for r in reports) >= 2  # the controller's token, on that Deployment alone
