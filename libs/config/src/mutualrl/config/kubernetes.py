"""How Kubernetes runs an experiment: the controller's settings and each policy's pod settings.

One source of truth for both ways the chart runs a policy: the Helm chart renders these sections into
the experiment file, its static workloads are rendered from the same values, and MWRA's controller builds
its gangs' pods from the file (docs/deploy.md, "One source of truth").
"""

from __future__ import annotations

import re
from typing import Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from mutualrl.config.strict import Strict

# a Kubernetes resource quantity: 500m, 2, 1.5, 64Gi, 1e3
_QUANTITY = re.compile(r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")
_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_RESOURCE_PARTS = ("requests", "limits")


def _check_quantities(section: dict, where: str) -> dict:
    for part, amounts in section.items():
        if part not in _RESOURCE_PARTS:
            raise ValueError(f"{where}: unknown key {part!r}; use requests and limits")
        if not isinstance(amounts, dict):
            raise ValueError(f"{where}.{part} must map resource names to quantities")
        for name, q in amounts.items():
            if isinstance(q, bool) or not _QUANTITY.match(str(q)):
                raise ValueError(f"{where}.{part}.{name}: {q!r} is not a Kubernetes quantity (e.g. 8, 500m, 64Gi)")
    return section


class ProbeConfig(Strict):
    """One HTTP probe of a service's ops port."""

    period_s: int = Field(10, ge=1, le=3600, description="Seconds between checks.")
    failure_threshold: int = Field(3, ge=1, le=10000, description="Failed checks in a row before Kubernetes acts.")


class ProbesConfig(Strict):
    """The probes of a service container (the startup probe allows for loading a large model)."""

    startup: ProbeConfig = Field(default_factory=lambda: ProbeConfig(period_s=10, failure_threshold=90))
    readiness: ProbeConfig = Field(default_factory=lambda: ProbeConfig(period_s=10, failure_threshold=3))
    liveness: ProbeConfig = Field(default_factory=lambda: ProbeConfig(period_s=20, failure_threshold=6))


class PodConfig(Strict):
    """Where and how a policy's pods run on Kubernetes; static workloads and MWRA's gangs alike.

    GPUs are not set here: the plan (MWRA) or the policy's GPU values (static) add ``nvidia.com/gpu``.
    """

    resources: dict[str, dict[str, Union[str, int, float]]] = Field(
        default_factory=dict, description="requests/limits of the rollout and learner containers; empty: "
                                          "resources.cpu and resources.memory.")
    engine_resources: dict[str, dict[str, Union[str, int, float]]] = Field(
        default_factory=dict, description="requests/limits of the vLLM/SGLang sidecar (it also holds the rollout "
                                          "GPUs).")
    engine_shm_size: str = Field("16Gi", description="Size of the sidecar's /dev/shm (tensor-parallel workers "
                                                     "exchange tensors through it).")
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict] = Field(default_factory=list, description="e.g. [{key: nvidia.com/gpu, operator: "
                                                                      "Exists, effect: NoSchedule}]")
    affinity: dict = Field(default_factory=dict)
    runtime_class_name: Optional[str] = Field(None, pattern=_NAME, description="e.g. nvidia")
    priority_class_name: Optional[str] = Field(None, pattern=_NAME)
    probes: ProbesConfig = Field(default_factory=ProbesConfig)

    @field_validator("resources", "engine_resources")
    @classmethod
    def _quantities(cls, v: dict, info) -> dict:
        return _check_quantities(v, f"kubernetes.{info.field_name}")

    @field_validator("engine_shm_size")
    @classmethod
    def _shm(cls, v: str) -> str:
        if not _QUANTITY.match(v):
            raise ValueError(f"kubernetes.engine_shm_size: {v!r} is not a Kubernetes quantity (e.g. 16Gi)")
        return v

    @field_validator("tolerations")
    @classmethod
    def _tolerations(cls, v: list[dict]) -> list[dict]:
        for t in v:
            if t.get("operator", "Equal") not in ("Equal", "Exists"):
                raise ValueError(f"toleration {t}: operator must be Equal or Exists")
            if t.get("effect") not in (None, "", "NoSchedule", "PreferNoSchedule", "NoExecute"):
                raise ValueError(f"toleration {t}: effect must be NoSchedule, PreferNoSchedule or NoExecute")
        return v


class ModelDownloadConfig(Strict):
    """An init container that fills the model volume from a registry the cluster reaches."""

    image: str = Field(..., min_length=1)
    command: list[str] = Field(..., min_length=1, description="Run with the model volume at /models (writable) and "
                                                              "HF_HOME, HF_TOKEN set; it should skip what is there.")


class ModelsConfig(Strict):
    """Where pods find the models: mounted at /models in every rollout, learner and engine container."""

    claim: Optional[str] = Field(None, pattern=_NAME, description="A PVC holding the models (read-only unless a "
                                                                  "download fills it).")
    host_path: Optional[str] = Field(None, pattern=r"^/", description="A directory on every GPU node.")
    download: Optional[ModelDownloadConfig] = None
    hf_home: str = Field("/models/hf", pattern=r"^/", description="HF_HOME of every container: a Hugging Face "
                                                                 "cache under the model volume.")
    hf_token_secret: Optional[str] = Field(None, pattern=_NAME, description="A Secret with key `token`, exposed as "
                                                                           "HF_TOKEN (gated models).")

    @model_validator(mode="after")
    def _one_source(self) -> "ModelsConfig":
        if self.claim and self.host_path:
            raise ValueError("kubernetes.models: give claim or host_path, not both")
        return self


class KubernetesConfig(Strict):
    """MWRA's kubernetes backend (`mutualrl controller`)."""

    namespace: str = Field("default", pattern=_NAME, description="Namespace the policy gangs run in.")
    image: str = Field("ghcr.io/mutualrl/mutualrl:0.1.0-cuda", description="Image of the rollout and learner pods.")
    gang: Literal["auto", "kueue", "kai", "volcano", "native", "mwra"] = Field(
        "auto",
        description="Gang backend; auto discovers the served API groups in the order kueue, kai, volcano, native, "
                    "else MWRA's own admission.")
    queue: str = Field("mutualrl", description="Kueue LocalQueue / KAI or Volcano queue name.")
    admission_timeout_s: float = Field(600.0, gt=0, description="mwra gang backend: evict and requeue a gang not "
                                       "running within this time.")
    redis_url: Optional[str] = Field(None, description="Broker URL the pods use.")
    redis_url_secret: Optional[str] = Field(None, description="Secret with key `redis-url` the pods read the broker "
                                            "URL from (the Helm chart sets it).")
    redis_users_secret: Optional[str] = Field(None, description="Secret with one Redis password per `<policy>.<role>` "
                                              "key: each pod's own ACL identity (the Helm chart "
                                              "sets it).")
    weights_claim: Optional[str] = Field(None, description="ReadWriteMany PVC mounted at /weights in every pod.")
    hmac_secret: Optional[str] = Field(None, description="Secret with key `hmac-key`, exposed to pods as "
                                       "MUTUALRL_HMAC_KEY.")
    models: ModelsConfig = Field(default_factory=ModelsConfig)
    state_claims: dict[str, str] = Field(
        default_factory=dict, description="`<policy>.<role>` -> a PVC mounted at /data (checkpoints, learner state, "
                                          "the rollout ledger), so a recreated pod resumes; a role without one "
                                          "keeps its state on the pod (lost with it).")
    image_pull_secrets: list[str] = Field(default_factory=list)
    tracking_secret: Optional[str] = Field(None, pattern=_NAME, description="A Secret whose keys become the "
                                           "learners' environment: a tracker's credentials (MLFLOW_TRACKING_USERNAME"
                                           ", MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_TOKEN, WANDB_API_KEY).")

    @field_validator("state_claims")
    @classmethod
    def _state_keys(cls, v: dict[str, str]) -> dict[str, str]:
        for key, claim in v.items():
            policy, _, role = key.rpartition(".")
            if not policy or role not in ("rollout", "learner"):
                raise ValueError(f"kubernetes.state_claims: key {key!r} is not <policy>.rollout or <policy>.learner")
            if not re.match(_NAME, claim):
                raise ValueError(f"kubernetes.state_claims[{key}]: {claim!r} is not a valid PVC name")
        return v


__all__ = ["KubernetesConfig", "ModelsConfig", "PodConfig", "ProbeConfig", "ProbesConfig"]
