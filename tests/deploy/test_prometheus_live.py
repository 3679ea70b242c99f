"""A real Prometheus (Debian's package, on loopback) scrapes a real `mutualrl up` run and a real
MWRA controller: every metric a dashboard panel or an alert reads returns data, the alert rules
load, and `promtool check metrics` passes on every service's /metrics."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import yaml
from conftest import CHART, ROOT

from mutualrl.app.dashboards import DASHBOARDS, metric_names

TOKEN = "live-test-token"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str | None = None, data: bytes | None = None, timeout: float = 5.0) -> bytes:
    req = urllib.request.Request(url, data=data, headers={**({"Authorization": f"Bearer {token}"} if token else {}),
                                                          **({"Content-Type": "application/json"} if data else {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - not up yet
            last = e
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what} ({last})")


def _expected_metrics() -> dict[str, str]:
    """metric -> where it is used (dashboards without engine-only panels, and every alert)."""
    out = {}
    for d in DASHBOARDS:
        for p in d.panels:
            if p.external:  # vLLM's and SGLang's own metrics: no such engine runs on a CPU machine
                continue
            for e in p.exprs:
                for m in metric_names(e):
                    out.setdefault(m, f"{d.uid}: {p.title}")
    for r in yaml.safe_load((CHART / "files" / "alerts.yml").read_text())["groups"][0]["rules"]:
        for m in metric_names(r["expr"]):
            out.setdefault(m, f"alert {r['alert']}")
    return out


def test_prometheus_scrapes_a_real_run_and_every_panel_and_alert_has_data(tmp_path):
    promtool, prometheus = shutil.which("promtool"), shutil.which("prometheus")
    assert promtool and prometheus, "run `make test-deploy`, which installs Debian's prometheus"
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MUTUALRL_API_TOKEN": TOKEN}
    up = subprocess.Popen([sys.executable, "-m", "mutualrl.app.cli", "up", str(ROOT / "examples" / "demo.yaml"),
                           "--out", str(out),
                           "--set", "budget.steps=40", "--set", "eval.every=2", "--set", "eval.size=32", "--set",
                           "sharing.mode=sgt"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    ctl_port, prom_port = _port(), _port()
    ctl = subprocess.Popen([sys.executable, "-m", "mutualrl.app.cli", "controller", "--host", "127.0.0.1", "--port",
                            str(ctl_port), "--backend", "memory",
                            "--gpus", "16"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    prom = None
    try:
        base = f"http://127.0.0.1:{ctl_port}"
        _wait(lambda: _get(base + "/healthz"), 60, "the controller")
        body = json.dumps({"config_yaml": (ROOT / "examples" / "mwra" / "two-policies-gpu.yaml").read_text()}).encode()
        exp = json.loads(_get(base + "/v1/experiments", TOKEN, body))
        for policy in exp["policies"]:
            for role, stage in (("rollout", "generate"), ("learner", "train")):
                body = {"policy": policy, "role": role, "step": 1, "stage_seconds": {stage: 30.0}}
                _get(f"{base}/v1/experiments/{exp['id']}/steps", TOKEN, json.dumps(body).encode())
        info = out / "services.json"
        services = _wait(lambda: json.loads(info.read_text()) if info.is_file() else None, 600, "services.json")
        targets = [svc["ops"].removeprefix("http://") for svc in services["services"].values()]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(CHART / "files" / "alerts.yml")],
            "scrape_configs": [{"job_name": "mutualrl", "static_configs": [{"targets": targets}]},
                               {"job_name": "controller", "static_configs": [{"targets": [f"127.0.0.1:{ctl_port}"]}]}],
        }))
        prom = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        api = f"http://127.0.0.1:{prom_port}/api/v1"

        def query(q: str) -> list:
            return json.loads(_get(f"{api}/query?{urllib.parse.urlencode({'query': q})}"))["data"]["result"]

        # both learners past a few steps with an evaluation, peers' experience converted
        def progressed():
            r = query('min(mutualrl_step{role="learner"})')
            return r and float(r[0]["value"][1]) >= 4 and len(query("mutualrl_thl_unaligned_ratio")) >= 1
        _wait(progressed, 900, "both learners at step 4 with peer experience")
        time.sleep(3)
        missing = {m: where for m, where in _expected_metrics().items() if not query(m)}
        assert not missing, f"metrics used by dashboards/alerts with no data: {missing}"
        targets_up = json.loads(_get(f"{api}/targets"))["data"]["activeTargets"]
        assert len(targets_up) == 5 and all(t["health"] == "up" for t in targets_up), [(t["scrapeUrl"], t["health"],
            t.get("lastError")) for t in targets_up]
        rules = json.loads(_get(f"{api}/rules"))["data"]["groups"][0]["rules"]
        n_alerts = len(yaml.safe_load((CHART / "files" / "alerts.yml").read_text())["groups"][0]["rules"])
        assert len(rules) == n_alerts and all(r["health"] == "ok" for r in rules), rules
        # the metrics themselves follow Prometheus' conventions
        for url in [svc["ops"] + "/metrics" for svc in services["services"].values()] + [base + "/metrics"]:
            text = _get(url)
            p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
            assert p.returncode == 0, (url, p.stdout.decode() + p.stderr.decode())
            samples = [line for line in text.decode().splitlines() if line and not line.startswith("#")]
            names = {line.split("{")[0].split(" ")[0] for line in samples}
            ours = {n for n in names if n.startswith("mutualrl_")}
            assert ours and all(n == n.lower() for n in ours)
            assert not [n for n in ours if "_ids" in n or n.endswith("_id")]
    finally:
        for proc in (prom, ctl):
            if proc is not None:
                proc.terminate()
        os.killpg(up.pid, signal.SIGTERM)
        for proc in (prom, ctl, up):
            if proc is not None:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
