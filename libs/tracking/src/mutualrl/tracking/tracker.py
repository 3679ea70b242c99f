"""One policy's trackers behind one call per step: the learner loop hands each ``metrics.jsonl`` record
to :meth:`Tracker.log` and the run's final numbers to :meth:`Tracker.finish`; the backends named in the
experiment's ``tracking`` section do the rest, each in its own thread (:mod:`mutualrl.tracking.guard`)."""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from pathlib import Path
from typing import Callable

from mutualrl.config.tracking import TrackingConfig
from mutualrl.tracking.backend import RunInfo
from mutualrl.tracking.guard import GuardedBackend
from mutualrl.tracking.points import by_rollouts, scalars, summary_scalars
from mutualrl.tracking.process import ProcessTracker

log = logging.getLogger("mutualrl.tracking")

PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
HINTS = {"tensorboard": "pip install tensorboard", "mlflow": "pip install 'mutualrl[tracking]' (or mlflow-skinny)",
         "wandb": "pip install 'mutualrl[tracking]' (or wandb)"}


def missing(backends: list[str]) -> list[str]:
    """The named trackers whose library is not installed."""
    return [b for b in backends if b in PACKAGES and importlib.util.find_spec(PACKAGES[b]) is None]


class DropCounter:
    """``mutualrl_tracking_dropped_points_total{backend, policy}`` in a Prometheus registry (a service's
    /metrics), or nothing when the run has no registry."""

    def __init__(self, registry=None):
        self._counter = None
        if registry is not None:
            from prometheus_client import Counter

            self._counter = Counter("mutualrl_tracking_dropped_points_total",
                                    "Points a tracker dropped (slow, down or misconfigured); metrics.jsonl is "
                                    "complete regardless.", ["backend", "policy"], registry=registry)

    def callback(self, backend: str, policy: str) -> Callable[[int], None]:
        """What a guarded backend calls with the number of points it dropped."""
        if self._counter is None:
            return lambda n: None
        child = self._counter.labels(backend=backend, policy=policy)
        child.inc(0)  # the series exists (at 0) from the start, so an alert can watch it
        return child.inc


class WarnOnce:
    """One warning per tracker per run, however many policies (and their guards) hit the same trouble."""

    def __init__(self, warn: Callable[[str], None]):
        self.warn = warn
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, backend: str, message: str) -> None:
        """Say ``message`` unless this backend already said something this run."""
        with self._lock:
            if backend in self._seen:
                return
            self._seen.add(backend)
        self.warn(message)


class Tracker:
    """A policy's trackers. ``log`` never blocks or raises; ``finish`` waits at most ``timeout_s``."""

    def __init__(self, backends: list[GuardedBackend], timeout_s: float):
        self.backends = backends
        self.timeout_s = timeout_s

    def log(self, record: dict) -> None:
        """One ``metrics.jsonl`` record: its scalars at its step, and the by-rollouts view."""
        if not self.backends or "step" not in record:
            return
        values = scalars(record)
        xr = by_rollouts(record)
        for b in self.backends:
            if values:
                b.submit("log", int(record["step"]), values)
            if xr and getattr(b.backend, "separate_axes", True):
                b.submit("log", xr[0], xr[1], points=0)

    def names(self) -> list[str]:
        """The backends this tracker runs."""
        return [b.name for b in self.backends]

    def finish(self, summary: dict) -> dict:
        """Log the policy's final numbers, close every backend within ``timeout_s`` in all; what each sent and
        dropped."""
        final = summary_scalars(summary)
        for b in self.backends:
            b.submit("finish", final, points=0)
        deadline = time.monotonic() + self.timeout_s
        for b in self.backends:
            b.close(max(0.1, deadline - time.monotonic()))
        return {b.name: b.stats.as_dict() for b in self.backends}

    def dropped(self) -> int:
        """Points dropped so far over every backend."""
        return sum(b.stats.dropped for b in self.backends)


def _build(name: str, cfg: TrackingConfig, info: RunInfo):
    if name == "tensorboard":
        from mutualrl.tracking.tensorboard_backend import TensorBoardBackend

        root = Path(cfg.tensorboard.dir) if cfg.tensorboard.dir else info.run_dir / "tensorboard"
        return TensorBoardBackend(info, root)
    if name == "mlflow":
        from mutualrl.tracking.mlflow_backend import MlflowBackend

        return MlflowBackend(info, cfg.mlflow.tracking_uri, cfg.mlflow.experiment, cfg.mlflow.parent_run_id)
    if name == "wandb":
        from mutualrl.tracking.wandb_backend import WandbBackend

        return WandbBackend(info, cfg.wandb.project, cfg.wandb.entity, cfg.wandb.mode)
    raise ValueError(f"unknown tracking backend {name!r}")


def open_tracker(cfg: TrackingConfig, info: RunInfo, warn: Callable[[str], None] | WarnOnce | None = None,
                 registry=None, drops: DropCounter | None = None) -> Tracker | ProcessTracker:
    """The trackers ``cfg`` names for one policy, started: in a child process (``tracking.isolation:
    process``, :mod:`mutualrl.tracking.child`) or in threads of this one. A tracker whose library is missing
    or whose settings are unusable is skipped with one line saying why; nothing here raises into the run.
    Give the policies of one process the same :class:`WarnOnce` (and ``drops``) so each trouble is said once."""
    once = warn if isinstance(warn, WarnOnce) else WarnOnce(warn or log.warning)
    drops = drops or DropCounter(registry)
    names = []
    for name in cfg.trackers():
        if name in missing([name]):
            once(name, f"tracking: {name} is not installed ({HINTS[name]}); this run logs without it")
            continue
        names.append(name)
    if names and cfg.isolation == "process":
        return ProcessTracker(cfg, info, names, once, lambda n: drops.callback(n, info.policy))
    guarded = []
    for name in names:
        try:
            backend = _build(name, cfg, info)
        except Exception as e:  # a bad URI or setting: the run goes on without this tracker
            once(name, f"tracking: {name} is off for this run: {e}")
            continue
        g = GuardedBackend(backend, cfg.max_pending, lambda m, n=name: once(n, m), drops.callback(name, info.policy),
                           batch_s=cfg.flush_every_s)
        g.submit("open", points=0)
        guarded.append(g)
    return Tracker(guarded, cfg.timeout_s)
