"""Weights & Biases: one run per policy, grouped by the experiment run, through the ``wandb`` SDK.
``mode: offline`` writes under the run directory (``<run>/wandb``) for a later ``wandb sync``."""

from __future__ import annotations

from typing_extensions import override

from mutualrl.tracking.backend import Backend, RunInfo


class WandbBackend(Backend):
    """A policy's W&B run: its config is the resolved experiment, its tags the run's labels."""

    name = "wandb"
    separate_axes = False  # W&B's step only grows: rollouts is logged as a field to plot against instead

    def __init__(self, info: RunInfo, project: str, entity: str | None, mode: str):
        import wandb  # checked by the caller

        self._wandb = wandb
        self.info = info
        self.project, self.entity, self.mode = project, entity, mode
        self.run = None

    @override
    def open(self) -> None:
        if self.run is not None:
            return
        self.info.run_dir.mkdir(parents=True, exist_ok=True)
        labels = [f"{k}:{v}"[:64] for k, v in self.info.tags.items() if k in ("sharing", "seed", "entry", "pair")]
        self.run = self._wandb.init(
            project=self.project, entity=self.entity, mode=self.mode, dir=str(self.info.run_dir),
            group=f"{self.info.experiment}-{self.info.group}", name=self.info.policy, job_type="policy",
            config={**self.info.params, **{f"tag.{k}": v for k, v in self.info.tags.items()}},
            tags=labels, reinit="create_new",
            settings=self._wandb.Settings(silent=True, console="off", x_disable_stats=True))

    @override
    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    @override
    def finish(self, summary: dict[str, float]) -> None:
        self.run.summary.update(summary)
        self.run.finish()
