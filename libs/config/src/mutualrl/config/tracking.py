"""Where a run's history goes besides ``metrics.jsonl``: TensorBoard, MLflow, Weights & Biases.

``metrics.jsonl`` is always written and stays the source of truth; a tracker is a copy for people to look
at, so nothing about it may slow or stop training (docs/tracking.md).
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from mutualrl.config.strict import Strict

BACKENDS = ("jsonl", "tensorboard", "mlflow", "wandb")
Backend = Literal["jsonl", "tensorboard", "mlflow", "wandb"]


class TensorBoardConfig(Strict):
    """TensorBoard event files, one directory per policy."""
    dir: Optional[str] = Field(None, description="Where the event files go; None = <run directory>/tensorboard. "
                                                 "Each policy writes <dir>/<policy>.")


class MlflowConfig(Strict):
    """An MLflow tracking server: a parent run per experiment, a child run per policy."""
    tracking_uri: Optional[str] = Field(None, description="http(s)://, file: or a database URI; None = the "
                                                          "MLFLOW_TRACKING_URI environment variable.")
    experiment: Optional[str] = Field(None, description="MLflow experiment name; None = the experiment's name.")
    parent_run_id: Optional[str] = Field(None, pattern=r"^[0-9a-f]{32}$",
                                         description="Nest this run's parent run under an existing MLflow run "
                                                     "(`mutualrl compare` sets it to the compare's run).")

    @field_validator("tracking_uri")
    @classmethod
    def _uri(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not v.strip():
            raise ValueError("tracking_uri is empty; leave it out to use MLFLOW_TRACKING_URI")
        return v


class WandbConfig(Strict):
    """Weights & Biases: one run per policy, grouped by the experiment."""
    project: str = Field("mutualrl", min_length=1, description="W&B project.")
    entity: Optional[str] = Field(None, description="W&B entity (team or user); None = the account's default.")
    mode: Literal["online", "offline"] = Field("online", description="offline writes the run under the run "
                                                                     "directory, for `wandb sync` later.")


class TrackingConfig(Strict):
    """Which experiment trackers a run logs to, and how far a slow one may fall behind."""
    backends: list[Backend] = Field(default_factory=lambda: ["jsonl", "tensorboard"],
                                    description="jsonl (always on), tensorboard, mlflow, wandb.")
    tensorboard: TensorBoardConfig = Field(default_factory=TensorBoardConfig)
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig)
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    tags: dict[str, str] = Field(default_factory=dict, description="Extra tags on every tracked run (team, "
                                                                   "ticket...); `mutualrl compare` adds entry, "
                                                                   "pair and seed.")
    max_pending: int = Field(10_000, ge=1, le=10_000_000,
                             description="Points a backend may hold while it is slow or down; newer points beyond "
                                         "this are dropped and counted (mutualrl_tracking_dropped_points_total).")
    flush_every_s: float = Field(5.0, ge=0, le=3600, description="A tracker gets the steps' points at most this "
                                 "often, several steps in one call (0: every step at once).")
    timeout_s: float = Field(15.0, gt=0, le=600, description="How long a backend's call may take at the end of a "
                                                            "run before its remaining points are dropped.")
    isolation: Literal["thread", "process"] = Field(
        "thread", description="thread: the trackers run in threads of the training process; process: in a child "
                              "process at low CPU priority, so a tracker library that hangs, leaks or crashes is "
                              "cut off from training (one more Python process per policy, a few seconds to start).")

    @field_validator("backends")
    @classmethod
    def _backends(cls, v: list[str]) -> list[str]:
        dup = sorted({b for b in v if v.count(b) > 1})
        if dup:
            raise ValueError(f"tracking.backends repeats {', '.join(dup)}")
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not k or len(k) > 250 or not all(c.isalnum() or c in "_-./ :" for c in k)]
        if bad:
            raise ValueError(f"tracking.tags: bad tag name(s) {bad}: use letters, digits and _-./: "
                             "(at most 250 characters)")
        return v

    @model_validator(mode="after")
    def _jsonl_always(self) -> "TrackingConfig":
        if "jsonl" not in self.backends:
            raise ValueError("tracking.backends must keep jsonl: metrics.jsonl is the run's record that compare, "
                             "resume and the reports read; add trackers beside it")
        return self

    def trackers(self) -> list[str]:
        """The backends other than the always-on jsonl file."""
        return [b for b in self.backends if b != "jsonl"]
