"""`mutualrl compare SPEC`: entries × pairs × seeds, resumable; the spec and the running of its runs.
:mod:`mutualrl.app.compare_analysis` reads the finished runs into ``results.json`` and
:mod:`mutualrl.app.compare_report` writes the report (confidence intervals, rollouts-to-target,
paired differences against the baseline).

A SPEC file::

    name: evidence
    baseline: isolated-grpo          # the entry the others are measured against
    seeds: [0, 1, 2, 3, 4]
    steps: 60                         # budget.steps for every run (optional)
    quick: {seeds: [0, 1], steps: 20} # what `--quick` runs instead (optional; may also narrow
                                      # entries: [...] and pairs: [...])
    pairs:                            # each a full experiment file (two or more policies)
      q25-char: examples/evidence/pair-q25-char.yaml
    entries:                          # overrides applied to every pair's file
      isolated-grpo: ["sharing.mode=none"]
      sgt: ["sharing.mode=sgt"]

Each run writes ``<out>/runs/<entry>/<pair>/seed<k>/`` (the files of `mutualrl run`); a run whose
``summary.json`` exists is skipped, so an interrupted compare resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from mutualrl.config import ConfigError, load_config


@dataclass
class CompareSpec:
    """A compare spec: entries (config overrides) x pairs (experiment files) x seeds, and its quick profile."""
    name: str
    baseline: str
    seeds: list[int]
    pairs: dict[str, Path]
    entries: dict[str, list[str]]
    steps: int | None = None
    quick: dict = field(default_factory=dict)
    efficiency_policy: str | None = None
    """The policy whose rollout efficiency is the claim, named in the spec before any run (so the report cannot pick
    whichever policy happened to look efficient): the report states its rollouts to the baseline's mean final
    accuracy per entry against the baseline's own."""

    @classmethod
    def load(cls, path: Path, quick: bool = False) -> "CompareSpec":
        """A compare file, checked: pairs resolved against the file, entries as config overrides; ``quick`` keeps its
        quick subset."""
        try:
            raw = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"{path}: {str(e).splitlines()[0]}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping")
        missing = [k for k in ("baseline", "seeds", "pairs", "entries") if k not in raw]
        if missing:
            raise ConfigError(f"{path}: missing {', '.join(missing)}")
        unknown = set(raw) - {"name", "baseline", "seeds", "pairs", "entries", "steps", "quick", "efficiency_policy"}
        if unknown:
            raise ConfigError(f"{path}: unknown keys {', '.join(sorted(unknown))}")
        spec = cls(str(raw.get("name", path.stem)), str(raw["baseline"]), [int(s) for s in raw["seeds"]],
                   {k: _resolve(path, v) for k, v in raw["pairs"].items()},
                   {k: [str(x) for x in (v or [])] for k, v in raw["entries"].items()}, raw.get("steps"),
                   raw.get("quick") or {},
                   str(raw["efficiency_policy"]) if raw.get("efficiency_policy") is not None else None)
        if spec.baseline not in spec.entries:
            raise ConfigError(f"{path}: baseline {spec.baseline!r} is not one of the entries "
                              f"({', '.join(spec.entries)})")
        if quick:
            spec.seeds = [int(s) for s in spec.quick.get("seeds", spec.seeds[:2])]
            spec.steps = spec.quick.get("steps", spec.steps)
            if "entries" in spec.quick:
                keep = set(spec.quick["entries"]) | {spec.baseline}
                spec.entries = {k: v for k, v in spec.entries.items() if k in keep}
            if "pairs" in spec.quick:
                spec.pairs = {k: v for k, v in spec.pairs.items() if k in spec.quick["pairs"]}
                if not spec.pairs:
                    raise ConfigError(f"{path}: quick.pairs names none of the pairs")
        for name, p in spec.pairs.items():
            if not p.is_file():
                raise ConfigError(f"{path}: pair {name!r}: {p} does not exist")
        return spec

    def subset(self, entries: list[str] | None = None, seeds: list[int] | None = None) -> "CompareSpec":
        """The same spec training only ``entries`` and ``seeds`` (None: all), in the order given: a user who names
        ``--entries sgt-r,sgt`` wants SGT-R's run first (the one that must finish within a session). A name or seed
        given twice is kept once: the runs are queued before any starts, so a repeat would train its run twice.
        ConfigError naming an unknown entry."""
        unknown = sorted(set(entries or []) - set(self.entries))
        if unknown:
            raise ConfigError(f"--entries: no entry {', '.join(unknown)} (entries: {', '.join(self.entries)})")
        chosen = dict(self.entries) if entries is None else {k: self.entries[k] for k in dict.fromkeys(entries)}
        return dataclasses.replace(self, entries=chosen,
                                   seeds=list(dict.fromkeys(seeds)) if seeds is not None else list(self.seeds))

    def runs(self) -> list[tuple[str, str, int]]:
        """Every (entry, pair, seed) to run, seed by seed so early seeds finish for every entry first."""
        return [(e, p, s) for s in self.seeds for p in self.pairs for e in self.entries]


def _resolve(spec_file: Path, value: str) -> Path:
    """A path in a compare file: absolute as given, else relative to the file."""
    return Path(value) if Path(value).is_absolute() else (spec_file.parent / value).resolve()


def run_dir(out: Path, entry: str, pair: str, seed: int) -> Path:
    """Where one run of a compare lives: ``<out>/runs/<entry>/<pair>/seed<k>``."""
    return out / "runs" / entry / pair / f"seed{seed}"


def run_label(entry: str, pair: str, seed: int) -> str:
    """How one run is named in the progress output and in the sessions log's ``run`` events (which
    compare_analysis matches against the runs on disk)."""
    return f"{entry} / {pair} / seed {seed}"


def _train_one(runner: Callable, cfg, d: Path, threads: int | None) -> None:
    """One run, in a worker process of a parallel compare: torch gets its share of the cores
    (threads spinning on oversubscribed cores cost more than they give). A spawned worker does not pass through
    the CLI's ``main``, so it sets the allocator itself."""
    from mutualrl.runtime.memory import reuse_freed_pages

    reuse_freed_pages()
    if threads:
        import torch

        torch.set_num_threads(threads)
    runner(cfg, d)


SESSIONS = "sessions.jsonl"


def _log_session(out: Path, session: float, event: str, **fields) -> None:
    """One line per compare invocation's start and per run it finished, so the wall time a whole
    compare took is known even when it was interrupted and resumed (each invocation counts from its
    start to its last finished run)."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / SESSIONS).open("a") as f:
        f.write(json.dumps({"session": session, "t": time.time(), "event": event, **fields}) + "\n")


class CompareInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a compare: ``finished`` runs are kept, the ones in progress were stopped and are redone on
    resume."""

    def __init__(self, finished: int, total: int):
        super().__init__(f"stopped: {finished} of {total} runs finished and kept; run the same command again to resume")
        self.finished, self.total = finished, total


def _ignore_sigint() -> None:
    """Worker processes leave Ctrl-C to the parent, which stops them all at once (a terminal sends
    SIGINT to the whole process group: workers that handled it themselves died mid-run while the
    pool handed them the next runs)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


class RunProcessDied(RuntimeError):
    """A run's worker process ended without finishing it or raising: killed from outside, most often by the kernel
    for memory. The finished runs are kept; the same command trains the run again (from its newest resume point where
    ``checkpoint.resume_every`` is set)."""

    def __init__(self, label: str):
        super().__init__(f"the process training {label} died without finishing it (killed from outside, most often "
                         "for memory: see the kernel log, `dmesg`); finished runs are kept, and the same command "
                         "trains it again, from its newest resume point where checkpoint.resume_every is set")
        self.label = label


def run_all(spec: CompareSpec, out: Path, runner: Callable,
            progress: Callable[[int, int, str], None] = lambda i, n, s: None,
            jobs: int = 1, on_start: Callable[[str, Path, int], None] = lambda label, d, steps: None,
            isolate: bool = False) -> list[Path]:
    """Every (entry, pair, seed) not finished yet; ``runner(cfg, dir)`` trains one (run_embedded).
    ``jobs`` > 1 trains that many at once in worker processes, each with ``cores // jobs`` torch
    threads (``runner`` must then be a module-level function). ``isolate`` trains every run in a process of its
    own at ``jobs`` 1 too, and a worker never takes a second run: a finished run's memory goes back to the system
    with its process. In one process it did not: with freed pages kept for reuse (the CLI's allocator setting,
    ``runtime.memory``) the second pair A run (SmolLM2 + Qwen2.5-Coder-0.5B) of a sequential compare began ~8 GiB
    above the first, and the third was killed for memory at 24 GiB writing its resume point (2026-12-05). The CLI
    isolates; in-process stays for runners that cannot be pickled. ``on_start(label, dir, steps)`` is
    told when a run starts, ``progress(finished, total, label)`` when one finishes or was finished
    before. Ctrl-C raises :class:`CompareInterrupted` once every run in progress has stopped; a worker killed from
    outside raises :class:`RunProcessDied`."""
    session = time.time()
    todo = spec.runs()
    pending: list[tuple[str, object, Path]] = []  # (label, config, run dir)
    done: list[Path] = []
    for entry, pair, seed in todo:
        d = run_dir(out, entry, pair, seed)
        label = run_label(entry, pair, seed)
        if (d / "summary.json").is_file():
            done.append(d)
            progress(len(done), len(todo), label + " (done before)")
            continue
        sets = [*spec.entries[entry], f"seed={seed}", *([f"budget.steps={spec.steps}"] if spec.steps else [])]
        # every config is checked before the first run starts
        cfg = load_config(spec.pairs[pair], sets)
        # a tracker overlays and filters the compare's runs by these (docs/tracking.md)
        cfg.tracking.tags = {**cfg.tracking.tags, "compare": spec.name, "entry": entry, "pair": pair,
                             "seed": str(seed)}
        pending.append((label, cfg, d))
    _nest_in_mlflow(spec, out, [cfg for _, cfg, _ in pending])
    if pending:
        _log_session(out, session, "start", jobs=jobs, pending=len(pending))
    try:
        if jobs <= 1 and not isolate:
            for label, cfg, d in pending:
                on_start(label, d, cfg.budget.steps)
                runner(cfg, d)
                done.append(d)
                _log_session(out, session, "run", run=label)
                progress(len(done), len(todo), label)
        else:
            _run_parallel(pending, runner, jobs, out, session, done, len(todo), progress, on_start)
    except KeyboardInterrupt:
        # counted on disk, as a resume counts them: a run that wrote its summary.json while the
        # Ctrl-C arrived is finished and kept, even if its worker's result was never collected
        kept = sum((run_dir(out, e, p, s) / "summary.json").is_file() for e, p, s in todo)
        raise CompareInterrupted(kept, len(todo)) from None
    return done


def _nest_in_mlflow(spec: CompareSpec, out: Path, configs: list) -> None:
    """When the runs log to MLflow: one run for the compare, each run's parent nested under it, and its page
    recorded for the report (``tracking.json``). A server that cannot be reached only costs the nesting."""
    logged = [c for c in configs if "mlflow" in c.tracking.backends]
    if not logged:
        return
    first = logged[0].tracking.mlflow
    try:
        from mutualrl.tracking.mlflow_backend import compare_run

        run_id, url = compare_run(first.tracking_uri, first.experiment or spec.name, spec.name)
    except Exception as e:  # the runs still log, unnested; training is never stopped by a tracker
        print(f"tracking: the compare's MLflow run could not be made ({type(e).__name__}: {e}); runs log unnested",
              file=sys.stderr)
        return
    for c in logged:
        c.tracking.mlflow.experiment = c.tracking.mlflow.experiment or spec.name
        c.tracking.mlflow.parent_run_id = run_id
    out.mkdir(parents=True, exist_ok=True)
    (out / "tracking.json").write_text(json.dumps({"mlflow_run_id": run_id, "mlflow_url": url}))


def _run_parallel(pending, runner: Callable, jobs: int, out: Path, session: float, done: list[Path], total: int,
                  progress: Callable[[int, int, str], None], on_start: Callable[[str, Path, int], None]) -> None:
    """Up to ``jobs`` runs at once, each in a one-worker pool of its own that ends with the run: a process never
    trains a second run (its freed memory stays with it, run_all), and a worker killed from outside breaks only its
    own run's pool, so the error names that run. (Not ``max_tasks_per_child``: Python 3.11–3.13 can deadlock
    replacing a worker that reached it, cpython gh-115634.)"""
    import multiprocessing
    import os
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    threads = max(1, (os.cpu_count() or 1) // jobs)
    context = multiprocessing.get_context("spawn")
    running: dict = {}  # future -> (label, run dir, its pool)
    try:
        queue = list(pending)

        def submit_next() -> None:  # at most `jobs` at once, so a run starts only when another has ended
            label, cfg, d = queue.pop(0)
            pool = ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_ignore_sigint)
            running[pool.submit(_train_one, runner, cfg, d, threads)] = (label, d, pool)
            on_start(label, d, cfg.budget.steps)

        while queue and len(running) < jobs:
            submit_next()
        while running:
            finished, _ = wait(set(running), return_when=FIRST_COMPLETED)  # each run is logged as it ends
            for f in finished:
                label, d, pool = running.pop(f)
                pool.shutdown(wait=True)
                error = f.exception()
                if isinstance(error, BrokenProcessPool):
                    raise RunProcessDied(label) from error
                if error is not None:
                    raise error
                done.append(d)
                _log_session(out, session, "run", run=label)
                progress(len(done), total, label)
                if queue:
                    submit_next()
    except BaseException:
        pools = [pool for _, _, pool in running.values()]
        for pool in pools:  # stop the runs in progress now
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.terminate()
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)
        raise
