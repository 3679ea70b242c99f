"""The controller's HTTP API (FastAPI): submit an experiment, read its plan, allocations and
status, stop it, or plan without starting anything. Every ``/v1`` route needs the bearer token;
``/healthz``, ``/metrics`` and ``/openapi.json`` do not."""

from __future__ import annotations

import hmac
import os
from pathlib import Path
from typing import Callable, Optional

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import generate_latest
from pydantic import BaseModel, Field

from mutualrl.config import ConfigError, parse_config
from mutualrl.services.mwra.controller import Controller
from mutualrl.services.mwra.planner import PlanningError

TOKEN_ENV, TOKEN_FILE_ENV = "MUTUALRL_API_TOKEN", "MUTUALRL_API_TOKEN_FILE"


class TokenMissing(RuntimeError):
    """The controller was started without a bearer token (MUTUALRL_API_TOKEN or MUTUALRL_API_TOKEN_FILE)."""
    pass


def read_token(env: dict[str, str] | None = None) -> str:
    """The bearer token from MUTUALRL_API_TOKEN, or the file MUTUALRL_API_TOKEN_FILE names (a
    mounted Secret). Refuses to run without one: the API creates pods."""
    env = dict(os.environ) if env is None else env
    token = env.get(TOKEN_ENV, "").strip()
    if not token and env.get(TOKEN_FILE_ENV):
        path = Path(env[TOKEN_FILE_ENV])
        if not path.is_file():
            raise TokenMissing(f"{TOKEN_FILE_ENV}={path}: no such file")
        token = path.read_text().strip()
    if not token:
        raise TokenMissing(f"set {TOKEN_ENV} (or {TOKEN_FILE_ENV}) to the bearer token the API accepts")
    return token


class Submission(BaseModel):
    """An experiment submitted to the controller, as the YAML `mutualrl validate` reads."""
    config_yaml: str = Field(..., max_length=1_000_000, description="The experiment file, as `mutualrl validate` reads "
                             "it.")


class StepReport(BaseModel):
    """One service's stage seconds for one step: a measurement of the policy's step cost."""
    policy: str = Field(..., max_length=40)
    role: str = Field(..., pattern="^(rollout|learner)$")
    step: int = Field(..., ge=0, le=10_000_000)
    stage_seconds: dict[str, float] = Field(default_factory=dict, description="generate | logprob | train | "
                                            "weight_sync -> seconds")


def _parse(yaml_text: str):
    try:
        return parse_config(yaml_text, "config_yaml", check_paths=False)
    except ConfigError as e:
        raise HTTPException(422, detail=[{"loc": ["body", "config_yaml"], "msg": str(e),
                                          "type": "config_error"}]) from None


def controller_health(controller: Controller) -> dict:
    """What the controller's ``/healthz`` answers: its backend, whether it leads, how many experiments it holds."""
    return {"status": "ok", "role": "controller", "backend": controller.backend.name, "leader": controller.leading,
            "experiments": len(controller.experiments)}


def create_app(controller: Controller, token: str, health: Callable[[], dict] | None = None) -> FastAPI:
    """The controller's HTTP API (FastAPI); every experiment route needs the bearer ``token``. ``health``: what
    ``/healthz`` answers (the service's; by default the controller's state)."""
    app = FastAPI(title="mutualrl MWRA controller", version="0.1.0",
                  description="Plans every policy's GPUs from measured step costs and places them all-or-nothing.")
    bearer = HTTPBearer(auto_error=False)

    def auth(creds: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> None:
        if creds is None or creds.scheme.lower() != "bearer" or not hmac.compare_digest(creds.credentials.encode(),
                token.encode()):
            raise HTTPException(401, detail="missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    _add_operational_routes(app, controller, health or (lambda: controller_health(controller)))
    _add_experiment_routes(app, controller, auth)
    return app


def _add_operational_routes(app: FastAPI, controller: Controller, health: Callable[[], dict]) -> None:
    """The unauthenticated routes probes and Prometheus use, and the planner's error as 409."""

    @app.exception_handler(PlanningError)
    async def _planning(request: Request, exc: PlanningError):
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    @app.get("/healthz")
    def healthz() -> dict:
        return health()

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(controller.registry).decode(), media_type="text/plain; version=0.0.4")



def _add_experiment_routes(app: FastAPI, controller: Controller, auth) -> None:
    """The bearer-token API: submit, list, inspect, report steps to, stop and dry-run experiments."""

    def get(exp_id: str):
        exp = controller.experiments.get(exp_id)
        if exp is None:
            raise HTTPException(404, detail=f"no experiment {exp_id!r}")
        return exp

    @app.post("/v1/experiments", status_code=201, dependencies=[Depends(auth)])
    def submit(body: Submission) -> dict:
        cfg = _parse(body.config_yaml)
        exp = controller.submit(cfg, body.config_yaml)
        return {**controller.view(exp), "plan": exp.plan.to_dict()}

    @app.get("/v1/experiments", dependencies=[Depends(auth)])
    def list_experiments() -> list[dict]:
        return [controller.view(e) for e in controller.experiments.values()]

    @app.get("/v1/experiments/{exp_id}", dependencies=[Depends(auth)])
    def status(exp_id: str) -> dict:
        return controller.view(get(exp_id))

    @app.get("/v1/experiments/{exp_id}/plan", dependencies=[Depends(auth)])
    def plan(exp_id: str) -> dict:
        return get(exp_id).plan.to_dict()

    @app.get("/v1/experiments/{exp_id}/allocations", dependencies=[Depends(auth)])
    def allocations(exp_id: str) -> dict:
        exp = get(exp_id)
        return {k: {"rollout_gpus": a.rollout_gpus, "learner_gpus": a.learner_gpus,
                    "nodes": sorted({p.node for p in a.placements})}
                for k, a in exp.plan.allocations.items()}

    @app.post("/v1/experiments/{exp_id}/steps", dependencies=[Depends(auth)])
    def report(exp_id: str, body: StepReport) -> dict:
        exp = get(exp_id)
        if body.policy not in exp.plan.allocations:
            raise HTTPException(404, detail=f"experiment {exp_id!r} has no policy {body.policy!r}")
        changed = controller.report_step(exp_id, body.policy, body.role, body.step, body.stage_seconds)
        return {"replanned": changed, "plan_generation": exp.plan.generation}

    @app.post("/v1/experiments/{exp_id}/stop", dependencies=[Depends(auth)])
    def stop(exp_id: str) -> dict:
        get(exp_id)
        return controller.view(controller.stop(exp_id))

    @app.post("/v1/plans/dry-run", dependencies=[Depends(auth)])
    def dry_run(body: Submission) -> dict:
        return controller.dry_run(_parse(body.config_yaml)).to_dict()
