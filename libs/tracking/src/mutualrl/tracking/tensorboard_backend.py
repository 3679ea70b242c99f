"""TensorBoard: event files through torch's ``SummaryWriter``, one directory per policy, so TensorBoard
shows the policies as runs and overlays them on every chart."""

from __future__ import annotations

from pathlib import Path

from typing_extensions import override

from mutualrl.tracking.backend import Backend, RunInfo


class TensorBoardBackend(Backend):
    """Writes ``<dir>/<policy>``: the scalars, the resolved config as text, and the parameters and tags in
    the HParams tab (so runs can be filtered by sharing mode or seed there)."""

    name = "tensorboard"
    separate_axes = True  # each tag has its own step: by_rollouts/ curves use rollouts as x

    def __init__(self, info: RunInfo, root: Path):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package: checked by the caller

        self._writer_cls = SummaryWriter
        self.info = info
        self.dir = root / info.policy
        self._writer = None
        self._session_end = None

    @override
    def open(self) -> None:
        from torch.utils.tensorboard.summary import hparams

        self._writer = self._writer_cls(log_dir=str(self.dir), flush_secs=10)
        hp = {**{f"tag.{k}": v for k, v in self.info.tags.items()}, **self.info.params}
        experiment, start, end = hparams(hp, {"eval/accuracy": 0.0, "train/reward_mean": 0.0})
        fw = self._writer._get_file_writer()
        fw.add_summary(experiment)
        fw.add_summary(start)
        self._session_end = end
        if self.info.config_yaml:
            self._writer.add_text("config", "```yaml\n" + self.info.config_yaml + "\n```", 0)

    @override
    def log(self, step: int, values: dict[str, float]) -> None:
        # one event holding every value of the step, not one event per scalar: a tenth of the writer's work
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=name, simple_value=value) for name, value in values.items()])
        self._writer._get_file_writer().add_summary(summary, step)

    def flush(self) -> None:
        """Write what is buffered to disk (TensorBoard reads the files as they grow)."""
        self._writer.flush()

    @override
    def finish(self, summary: dict[str, float]) -> None:
        if summary:
            self.log(0, summary)
        if self._session_end is not None:
            self._writer._get_file_writer().add_summary(self._session_end)
        self._writer.close()
