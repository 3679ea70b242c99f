"""Live progress in the terminal (rich); plain lines when output is not a terminal."""

from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from typing_extensions import override

from mutualrl.app.embedded import Reporter
from mutualrl.config import ExperimentConfig
from mutualrl.services.learner import StepRecord


class LiveReporter(Reporter):
    """Prints a run's progress (warm start, steps, evaluations) to the terminal as it happens."""
    def __init__(self, cfg: ExperimentConfig):
        self.cfg = cfg
        self.console = Console()
        self.live: Live | None = None
        self.t0 = time.monotonic()
        self._phase = ""

    def __enter__(self) -> "LiveReporter":
        if self.console.is_terminal:
            self.live = Live(self._render([], 0, self.cfg.budget.steps), console=self.console, refresh_per_second=4)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live:
            self.live.__exit__(*exc)

    def _render(self, records: list[StepRecord], last_eval: dict[str, float], step: int, total: int) -> Table:
        t = Table(title=f"{self.cfg.name} · sharing={self.cfg.sharing.describe()} · step {step}/{total} · "
                  f"{time.monotonic() - self.t0:.0f}s · {self._phase}")
        for col in ("policy", "reward", "loss", "clip", "rescues", "thl u", "held-out acc"):
            t.add_column(col)
        for r in records:
            t.add_row(
                r.policy,
                f"{r.reward_mean:.3f}",
                f"{r.loss:+.4f}",
                f"{r.clip_frac or 0:.3f}",
                str(r.rescue_count),
                f"{r.thl_residual:.3f}",
                f"{last_eval.get(r.policy, float('nan')):.1%}",
            )
        return t

    @override
    def phase(self, text: str) -> None:
        self._phase = text
        if self.live:
            self.live.update(self._render([], {}, 0, self.cfg.budget.steps))
        else:
            self.console.print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", highlight=False, markup=False)

    @override
    def note(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)  # above the live table, which stays

    @override
    def warn(self, text: str) -> None:
        # the text is data, not markup: a policy's name in brackets ("[smollm2]") must print as it is
        self.console.print(f"[yellow]warning:[/] {escape(text)}", highlight=False, soft_wrap=True)

    @override
    def step(self, step: int, total: int, records: list[StepRecord], last_eval: dict[str, float]) -> None:
        if self.live:
            self._phase = "training"
            self.live.update(self._render(records, last_eval, step, total))
            return
        parts = [
            f"{r.policy}: reward {r.reward_mean:.3f} rescues {r.rescue_count} acc "
            f"{last_eval.get(r.policy, float('nan')):.1%}"
            for r in records
        ]
        head = f"[{time.monotonic() - self.t0:6.1f}s] step {step}/{total}"
        self.console.print(f"{head} | " + " | ".join(parts), highlight=False, markup=False)
