"""What `mutualrl compare` shows while it runs: on a terminal, each run in progress with its step,
seconds per step and ETA (read from the run's own ``metrics.jsonl``, so runs in worker processes
show too); when output is piped or logged, one line per finished run."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table
from typing_extensions import override

from mutualrl.app.embedded import Reporter, run_embedded
from mutualrl.services.learner import StepRecord

PROGRESS_FILE = "progress.log"


class FileReporter(Reporter):
    """A run's phases (loading, warm-start progress, evaluations) and steps as lines of
    ``<run>/progress.log``: what a compare shows of a run that has no step yet, and what
    ``tail -f`` follows when the compare's output goes to a log."""

    def __init__(self, path: Path):
        self.path = path
        self.t0 = time.monotonic()

    def _write(self, text: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(f"[{time.monotonic() - self.t0:7.1f}s] {text}\n")

    @override
    def phase(self, text: str) -> None:
        self._write(text)

    @override
    def warn(self, text: str) -> None:
        self._write(text)  # beside the phases it concerns, and on stderr (the compare's own log)
        super().warn(text)

    @override
    def step(self, step: int, total: int, records: list[StepRecord], last_eval: dict[str, float]) -> None:
        self._write(f"step {step}/{total}")


def run_reporting_to_file(cfg, run_dir: Path) -> dict:
    """``run_embedded`` with its progress in ``<run_dir>/progress.log`` (module level: compare's
    worker processes pickle it)."""
    return run_embedded(cfg, run_dir, FileReporter(run_dir / PROGRESS_FILE))


def last_phase(run_dir: Path) -> str:
    """The newest line of a run's progress.log, without its timestamp ('' when there is none)."""
    try:
        lines = (run_dir / PROGRESS_FILE).read_text().splitlines()
    except OSError:
        return ""
    return lines[-1].split("] ", 1)[-1] if lines else ""


@dataclass
class _Running:
    run_dir: Path
    steps: int
    started: float


def steps_done(run_dir: Path) -> int:
    """The last RL step a run's ``metrics.jsonl`` records (0 before its first)."""
    path = run_dir / "metrics.jsonl"
    best = 0
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        try:
            step = json.loads(line).get("step")
        except (json.JSONDecodeError, AttributeError):
            continue  # a line being written
        if isinstance(step, int) and step > best:
            best = step
    return best


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


class CompareProgress:
    """The ``on_start`` and ``progress`` callbacks of :func:`mutualrl.app.compare.run_all`."""

    def __init__(self, console: Console, total: int):
        self.console = console
        self.total = total
        self.finished = 0
        self.before = 0
        self.durations: list[float] = []
        self.running: dict[str, _Running] = {}
        self.live: Live | None = None
        self.t0 = time.monotonic()

    def __enter__(self) -> "CompareProgress":
        if self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=1, get_renderable=self.render, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live:
            self.live.__exit__(*exc)

    def on_start(self, label: str, run_dir: Path, steps: int) -> None:
        """A run started: shown live on a terminal, one line (with its progress file) otherwise."""
        self.running[label] = _Running(run_dir, steps, time.monotonic())
        if not self.live:  # a log shows what is in progress (a first run may warm-start for long)
            self.console.print(f"run started: {label} ({steps} steps) -> {run_dir} (progress: "
                               f"{run_dir / PROGRESS_FILE})",
                               highlight=False, markup=False, soft_wrap=True)

    def progress(self, finished: int, total: int, label: str) -> None:
        """A run finished (or was found finished before): its line with the runs left and the ETA."""
        self.finished = finished
        if label.endswith("(done before)"):
            self.before += 1
            return
        run = self.running.pop(label, None)
        took = time.monotonic() - run.started if run else 0.0
        if run:
            self.durations.append(took)
        left = total - finished
        eta = f", ETA {_duration(self._eta(left))}" if left and self.durations else ""
        done_before = f" ({self.before} done before)" if self.before else ""
        self.console.print(f"run {finished}/{total} finished in {_duration(took)}: {label} — {left} "
                           f"left{eta}{done_before}",
                           highlight=False, markup=False, soft_wrap=True)

    def _eta(self, left: int) -> float:
        per_run = sum(self.durations) / len(self.durations)
        in_progress = sum(min(per_run, time.monotonic() - r.started) for r in self.running.values())
        return max(0.0, left * per_run - in_progress) / max(1, len(self.running) or 1)

    def render(self) -> Table:
        """The live table: each running run's step, seconds per step and ETA."""
        elapsed = time.monotonic() - self.t0
        table = Table(title=f"compare: {self.finished}/{self.total} runs finished · {_duration(elapsed)}",
                      title_justify="left")
        for col in ("run", "step", "s/step", "ETA"):
            table.add_column(col)
        for label, run in self.running.items():
            k = steps_done(run.run_dir)
            spent = time.monotonic() - run.started
            rate = spent / k if k else None
            table.add_row(label, f"{k}/{run.steps}", f"{rate:.1f}" if rate else "-",
                          _duration((run.steps - k) * rate) if rate else (last_phase(run.run_dir) or "starting"))
        return table
