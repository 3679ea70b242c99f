"""The control API: schemathesis over its OpenAPI (no 5xx), the bearer token, 422 for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings

from mutualrl.services.mwra.api import TokenMissing, create_app, read_token
from mutualrl.services.mwra.backends.base import InMemoryBackend
from mutualrl.services.mwra.controller import Controller
from mutualrl.services.mwra.planner import Node

TOKEN = "s3cret-token"
ROOT = Path(__file__).resolve().parents[2]
GOOD = (ROOT / "examples" / "mwra" / "two-policies-gpu.yaml").read_text()
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def make_app():
    return create_app(Controller(InMemoryBackend([Node(f"n{i}", 8) for i in range(4)])), TOKEN)


@pytest.fixture()
def http():
    return TestClient(make_app())


def test_every_v1_route_needs_the_token(http):
    schema = http.get("/openapi.json").json()
    v1 = [(path, m) for path, ops in schema["paths"].items() if path.startswith("/v1") for m in ops]
    assert len(v1) >= 7
    for path, method in v1:
        url = path.replace("{exp_id}", "x")
        assert http.request(method.upper(), url).status_code == 401, (method, path)
        assert http.request(method.upper(), url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert http.get("/healthz").status_code == 200 and http.get("/metrics").status_code == 200


def test_submit_plan_report_stop(http):
    r = http.post("/v1/experiments", json={"config_yaml": GOOD}, headers=AUTH)
    assert r.status_code == 201, r.text
    exp = r.json()
    assert exp["plan"]["policies"]["large"]["rollout_gpus"] % 2 == 0  # TP pairs
    eid = exp["id"]
    assert http.get(f"/v1/experiments/{eid}/allocations", headers=AUTH).json()["small"]["learner_gpus"] >= 1
    # measured: the small policy is far more expensive than seeded -> one re-plan ("measured")
    for policy, gen, train in (("small", 400.0, 300.0), ("large", 5.0, 5.0)):
        http.post(f"/v1/experiments/{eid}/steps",
                  json={"policy": policy, "role": "rollout", "step": 1, "stage_seconds": {"generate": gen}},
                  headers=AUTH)
        last = http.post(f"/v1/experiments/{eid}/steps",
                         json={"policy": policy, "role": "learner", "step": 1, "stage_seconds": {"train": train}},
                         headers=AUTH)
    assert last.json()["replanned"] is True
    assert http.get(f"/v1/experiments/{eid}", headers=AUTH).json()["history"][-1]["reason"] == "measured"
    metrics = http.get("/metrics").text
    assert 'mutualrl_mwra_replans_total{reason="measured"} 1.0' in metrics
    assert "mutualrl_mwra_partial_gang_gpu_seconds_total 0.0" in metrics
    assert 'mutualrl_mwra_allocated_gpus{policy="large",role="rollout"}' in metrics
    assert http.post(f"/v1/experiments/{eid}/stop", headers=AUTH).json()["status"] == "stopped"


def test_a_bad_experiment_gets_422_naming_the_field(http):
    bad = GOOD.replace("rollout_tp: 2", "rollout_tp: two")
    r = http.post("/v1/experiments", json={"config_yaml": bad}, headers=AUTH)
    assert r.status_code == 422 and "rollout_tp" in r.text
    r = http.post("/v1/plans/dry-run", json={"config_yaml": "policies: [unclosed"}, headers=AUTH)
    assert r.status_code == 422 and "malformed YAML" in r.text
    too_big = GOOD.replace("learner_gpus: 2, scaling", "learner_gpus: 40, scaling")
    r = http.post("/v1/plans/dry-run", json={"config_yaml": too_big}, headers=AUTH)
    assert r.status_code == 409 and "minimum gangs need" in r.text


def test_token_comes_from_env_or_file(tmp_path):
    assert read_token({"MUTUALRL_API_TOKEN": "abc"}) == "abc"
    (tmp_path / "t").write_text("from-file\n")
    assert read_token({"MUTUALRL_API_TOKEN_FILE": str(tmp_path / "t")}) == "from-file"
    with pytest.raises(TokenMissing):
        read_token({})


schema = schemathesis.openapi.from_asgi("/openapi.json", make_app())


@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    case.headers = {**(case.headers or {}), **AUTH}
    response = case.call()
    assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:300])
