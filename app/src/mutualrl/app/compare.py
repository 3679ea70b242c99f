"""`mutualrl compare SPEC`: entries × pairs × seeds, resumable, then a report with confidence
intervals, rollouts-to-target and paired differences against the baseline.

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
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from mutualrl.config import ConfigError, load_config
from mutualrl.runtime.compare_stats import auc, ci95, paired, rollouts_to_target
from mutualrl.runtime.eval_analysis import answer_style, correct_by_problem, per_problem_paired, read_evals
from mutualrl.runtime.outputs import read_metrics


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
        """The same spec training only ``entries`` and ``seeds`` (None: all); ConfigError naming an unknown one."""
        unknown = sorted(set(entries or []) - set(self.entries))
        if unknown:
            raise ConfigError(f"--entries: no entry {', '.join(unknown)} (entries: {', '.join(self.entries)})")
        return dataclasses.replace(
            self, entries={k: v for k, v in self.entries.items() if entries is None or k in entries},
            seeds=list(seeds) if seeds is not None else list(self.seeds))

    def runs(self) -> list[tuple[str, str, int]]:
        """Every (entry, pair, seed) to run, seed by seed so early seeds finish for every entry first."""
        return [(e, p, s) for s in self.seeds for p in self.pairs for e in self.entries]


def _resolve(spec_file: Path, value: str) -> Path:
    """A path in a compare file: absolute as given, else relative to the file."""
    return Path(value) if Path(value).is_absolute() else (spec_file.parent / value).resolve()


def run_dir(out: Path, entry: str, pair: str, seed: int) -> Path:
    """Where one run of a compare lives: ``<out>/runs/<entry>/<pair>/seed<k>``."""
    return out / "runs" / entry / pair / f"seed{seed}"


def _train_one(runner: Callable, cfg, d: Path, threads: int | None) -> None:
    """One run, in a worker process of a parallel compare: torch gets its share of the cores
    (threads spinning on oversubscribed cores cost more than they give)."""
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


def run_all(spec: CompareSpec, out: Path, runner: Callable,
            progress: Callable[[int, int, str], None] = lambda i, n, s: None,
            jobs: int = 1, on_start: Callable[[str, Path, int], None] = lambda label, d, steps: None) -> list[Path]:
    """Every (entry, pair, seed) not finished yet; ``runner(cfg, dir)`` trains one (run_embedded).
    ``jobs`` > 1 trains that many at once in worker processes, each with ``cores // jobs`` torch
    threads (``runner`` must then be a module-level function). ``on_start(label, dir, steps)`` is
    told when a run starts, ``progress(finished, total, label)`` when one finishes or was finished
    before. Ctrl-C raises :class:`CompareInterrupted` once every run in progress has stopped."""
    session = time.time()
    todo = spec.runs()
    pending: list[tuple[str, object, Path]] = []  # (label, config, run dir)
    done: list[Path] = []
    for entry, pair, seed in todo:
        d = run_dir(out, entry, pair, seed)
        label = f"{entry} / {pair} / seed {seed}"
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
        if jobs <= 1:
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
    import multiprocessing
    import os
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    threads = max(1, (os.cpu_count() or 1) // jobs)
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_ignore_sigint)
    try:
        queue = list(pending)
        running: dict = {}

        def submit_next() -> None:  # at most `jobs` submitted, so a run starts only when a worker is free
            label, cfg, d = queue.pop(0)
            running[pool.submit(_train_one, runner, cfg, d, threads)] = (label, d)
            on_start(label, d, cfg.budget.steps)

        while queue and len(running) < jobs:
            submit_next()
        while running:
            finished, _ = wait(set(running), return_when=FIRST_COMPLETED)  # each run is logged as it ends
            for f in finished:
                label, d = running.pop(f)
                if f.exception() is not None:
                    raise f.exception()
                done.append(d)
                _log_session(out, session, "run", run=label)
                progress(len(done), total, label)
                if queue:
                    submit_next()
    except BaseException:
        for proc in list(getattr(pool, "_processes", {}).values()):  # stop the runs in progress now
            proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _curves(records: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """Per policy, (rollouts, held-out accuracy) at each evaluation of a run's records."""
    out: dict[str, list[tuple[float, float]]] = {}
    for rec in records:
        if rec.get("eval_accuracy") is not None:
            out.setdefault(rec["policy"], []).append((float(rec.get("rollouts") or 0), float(rec["eval_accuracy"])))
    return out


def _answer_format(d: Path) -> str:
    """The answer format a run's task was scored in (its resolved config.yaml)."""
    try:
        return (yaml.safe_load((d / "config.yaml").read_text()).get("task") or {}).get("answer_format") or "whole"
    except (OSError, yaml.YAMLError, AttributeError):
        return "whole"


SHARING_COUNTS = ("rescue_count", "hints_offered", "hints_gated_out", "hints_masked", "hints_refused", "rescue_samples",
                  "rescued", "rescue_trained")
"""Per-run sums of a policy's step records that say whether a mode was exercised at all."""


RESCUE_MEANS = ("hint_weight_mean", "hint_floored_frac", "hint_capped_frac", "hint_delta_mean")
"""SGT-R's per-step means (a rescued token's weight toward the hint-free policy, the shares of tokens at its floor and
its cap, the information gate's Δ) that a run's figure averages over the steps that had any: why a receiver did or
did not learn from its rescues."""


def _sharing_counts(records: list[dict]) -> dict[str, dict[str, float]]:
    """Per policy: the run's sums of :data:`SHARING_COUNTS`, its steps, SGT-R's trained rescues per step, and each of
    :data:`RESCUE_MEANS` as its mean over the steps that recorded it (absent when none did)."""
    out: dict[str, dict[str, float]] = {}
    means: dict[str, dict[str, list[float]]] = {}
    for rec in records:
        if rec.get("phase") == "warm_start" or not rec.get("step"):
            continue
        c = out.setdefault(rec["policy"], {k: 0.0 for k in (*SHARING_COUNTS, "steps")})
        c["steps"] += 1
        for k in SHARING_COUNTS:
            c[k] += float(rec.get(k) or 0)
        for k in RESCUE_MEANS:
            if isinstance(rec.get(k), (int, float)):
                means.setdefault(rec["policy"], {}).setdefault(k, []).append(float(rec[k]))
    for policy, c in out.items():
        c["trained_per_step"] = c["rescue_trained"] / c["steps"] if c["steps"] else 0.0
        c.update({k: sum(v) / len(v) for k, v in means.get(policy, {}).items()})
    return out


def _edge_totals(records: list[dict]) -> dict[str, dict[str, float]]:
    """Per sharing edge (``source->receiver``): the run's sums of what its step records counted on it (``edges``,
    recorded when the experiment names a sharing graph): messages offered and used, refused as stale or by THL, and
    SGT's or SGT-R's rescues, hints and rescue samples."""
    out: dict[str, dict[str, float]] = {}
    for rec in records:
        if rec.get("phase") == "warm_start" or not rec.get("step") or not isinstance(rec.get("edges"), dict):
            continue
        for edge, counts in rec["edges"].items():
            c = out.setdefault(edge, {})
            for k, v in (counts or {}).items():
                if isinstance(v, (int, float)):
                    c[k] = c.get(k, 0.0) + float(v)
    return out


def _entropy_ends(records: list[dict]) -> dict[str, tuple[float, float]]:
    """Per policy: the sampling entropy's estimate (``own_sampled_nll``, nats a token) of its first and its last step
    that recorded one — the first step's rollouts are sampled before any update. Runs from before the field have
    none."""
    seen: dict[str, list[tuple[int, float]]] = {}
    for rec in records:
        v = rec.get("own_sampled_nll")
        if rec.get("step") and rec.get("phase") != "warm_start" and isinstance(v, (int, float)):
            seen.setdefault(rec["policy"], []).append((int(rec["step"]), float(v)))
    return {p: (min(v)[1], max(v)[1]) for p, v in seen.items()}


def _hint_examples(records: list[dict], per_edge: int = 5) -> dict[str, list[dict]]:
    """Per receiving policy: up to ``per_edge`` of the (hint, rescue sample) pairs its step records kept for each
    incoming edge (``hint_examples``), verified samples first, then by step, so a report shows what a peer's hint
    looked like in the receiver's prompt and what the receiver wrote from it."""
    found: dict[str, dict[str, list[dict]]] = {}
    for rec in records:
        for ex in rec.get("hint_examples") or ():
            if isinstance(ex, dict) and isinstance(ex.get("sample"), str):
                found.setdefault(rec["policy"], {}).setdefault(str(ex.get("source")), []).append(
                    {**ex, "step": rec.get("step")})
    out: dict[str, list[dict]] = {}
    for policy, edges in found.items():
        for exs in edges.values():
            exs.sort(key=lambda e: (-(float(e.get("reward") or 0) > 0), e.get("step") or 0))
            out.setdefault(policy, []).extend(exs[:per_edge])
    return out


_LOADED = re.compile(r"\[([^\]]+)\] loading model \(([\w-]+):")


def _precisions(d: Path, summary: dict) -> dict[str, str]:
    """Per policy, the precision its run trained in: the summary's (runs since 2026-11-28), else the progress log's
    "loading model (…)" line; ``model.dtype: auto`` resolves by the machine's CPU, so one compare's runs can differ."""
    out = {k: v["precision"] for k, v in summary.get("policies", {}).items() if v.get("precision")}
    log = d / "progress.log"
    if log.is_file():
        for m in _LOADED.finditer(log.read_text(errors="replace")):
            out.setdefault(m.group(1), m.group(2))
    return out


def _chosen_dtypes(d: Path) -> dict[str, str]:
    """Per policy, the ``model.dtype`` a run's resolved config.yaml asked for (``auto`` when it says none)."""
    try:
        policies = yaml.safe_load((d / "config.yaml").read_text()).get("policies") or []
        return {p["name"]: (p.get("model") or {}).get("dtype") or "auto" for p in policies}
    except (OSError, yaml.YAMLError, AttributeError, KeyError, TypeError):
        return {}


def _note_precisions(seen: dict[str, dict[str, list[str]]], left_to_auto: set[str], run: dict[str, str],
                     chosen: dict[str, str], label: str) -> None:
    """Add one run's per-policy precision to ``seen`` (policy -> precision -> the runs that trained in it), and to
    ``left_to_auto`` each policy whose precision this run left to the machine (``auto``, or no config to say)."""
    for policy, prec in run.items():
        seen.setdefault(policy, {}).setdefault(prec, []).append(label)
        if chosen.get(policy, "auto") == "auto":
            left_to_auto.add(policy)


def _mean_present(values: list) -> float | None:
    """The mean of the values that are there (None left out); None when none is."""
    have = [v for v in values if v is not None]
    return sum(have) / len(have) if have else None


def _mean_counts(runs: list[dict[str, float]]) -> dict[str, float] | None:
    """Each count's mean over an entry's runs (a count a run lacks is 0 in it); each of :data:`RESCUE_MEANS`, a mean
    already, over the runs that have it."""
    if not runs:
        return None
    keys = dict.fromkeys(k for r in runs for k in r)
    return {k: _mean_present([r.get(k) for r in runs]) if k in RESCUE_MEANS else sum(r.get(k, 0.0) for r in runs)
            / len(runs) for k in keys}


def _mean_style(runs: list[dict]) -> dict | None:
    """Answer style (start and final evaluation; the sampling entropy of the first and last step) averaged over an
    entry's runs, each figure over the runs that have it."""
    if not runs:
        return None
    return {when: {k: _mean_present([r[when].get(k) for r in runs])
                   for k in dict.fromkeys(k for r in runs for k in r[when])} for when in ("start", "final")}


def _rollouts_needed(run: dict, target: float) -> tuple[float, bool]:
    """Rollouts a run's curve needs to reach ``target``, and whether it reached it; one that never does counts as
    twice its budget (more than the whole budget it had)."""
    r = rollouts_to_target(run["curve"], target)
    return (r, True) if r is not None else (2.0 * float(run["rollouts"]), False)


def _rollouts_to_mean_final(seeds: dict[int, dict], base: dict[int, dict]) -> dict | None:
    """Rollouts each run needs to reach the baseline entry's *mean* final accuracy over its seeds (the efficiency
    goal's target), as mean ± ci95 over the runs, with how many reached it; a run that never does counts as twice its
    budget, as in the ratio. None without baseline runs."""
    if not base or not seeds:
        return None
    target = sum(b["final"] for b in base.values()) / len(base)
    found = [_rollouts_needed(v, target) for v in seeds.values()]
    return {"target": target, "rollouts": ci95([n for n, _ in found]), "reached": sum(hit for _, hit in found),
            "runs": len(found)}


def _policy_row(seeds: dict[int, dict], base: dict[int, dict], is_baseline: bool) -> dict:
    """One entry's results for one policy over its seeds (``seeds``: seed -> what its run said), against the
    baseline entry's runs of the same policy (``base``)."""
    finals = {s: v["final"] for s, v in seeds.items()}
    gains = {s: v["final"] - v["start"] for s, v in seeds.items()}
    row = {"final_accuracy": ci95(list(finals.values())), "gain": ci95(list(gains.values())),
           "auc": ci95([auc(v["curve"]) for v in seeds.values()]), "seeds": sorted(seeds),
           # kept per seed so that later compares can pool or pair with these runs from results.json
           # alone (run directories are not committed)
           "final_by_seed": {str(s): finals[s] for s in sorted(finals)}}
    ratios = []
    for s, v in seeds.items():
        b = base.get(s)
        if b is None:
            continue
        target = b["final"]
        rb = rollouts_to_target(b["curve"], target)
        if rb:
            ratios.append(_rollouts_needed(v, target)[0] / rb)
    row["rollouts_to_target_ratio"] = ci95(ratios) if ratios else None
    row["rollouts_to_baseline_mean"] = _rollouts_to_mean_final(seeds, base)
    b_finals = {s: v["final"] for s, v in base.items()}
    comparable = set(finals) & set(b_finals) and not is_baseline
    row["paired_vs_baseline"] = paired(finals, b_finals) if comparable else None
    correct = {s: v["correct"] for s, v in seeds.items() if v.get("correct")}
    b_correct = {s: v["correct"] for s, v in base.items() if v.get("correct")}
    row["per_problem_vs_baseline"] = per_problem_paired(correct, b_correct) if not is_baseline else None
    row["style"] = _mean_style([v["style"] for v in seeds.values() if v.get("style")])
    row["sharing"] = _mean_counts([v["sharing"] for v in seeds.values() if v.get("sharing")])
    # the examples of the first seed that kept any: what the hints and rescues looked like
    row["hint_examples"] = next((seeds[s]["hint_examples"] for s in sorted(seeds) if seeds[s]["hint_examples"]), [])
    return row


def analyse(spec: CompareSpec, out: Path) -> dict:
    """results.json: per pair, entry and policy — final accuracy, gain, AUC (mean ± ci95), each seed's final
    accuracy, rollouts-to-target ratio against the baseline, and paired differences."""
    results: dict = {"name": spec.name, "baseline": spec.baseline, "seeds": spec.seeds, "steps": spec.steps,
                     "efficiency_policy": spec.efficiency_policy, "pairs": {}, "steps_by_pair": {}, "wall_by_pair": {}}
    for pair in spec.pairs:
        per: dict[str, dict[str, dict[int, dict]]] = {}
        walls: dict[str, dict[str, list[float]]] = {}  # entry -> {"run": [...], "rl": [...]} seconds per run
        steps_seen: set[int] = set()
        precisions: dict[str, dict[str, list[str]]] = {}  # policy -> precision -> the runs trained in it
        left_to_auto: set[str] = set()  # policies whose precision some run left to the machine
        edge_runs: dict[str, list[dict[str, dict[str, float]]]] = {}  # entry -> each run's per-edge sums
        for entry in spec.entries:
            for seed in spec.seeds:
                d = run_dir(out, entry, pair, seed)
                if not (d / "summary.json").is_file():
                    continue
                summary = json.loads((d / "summary.json").read_text())
                if summary.get("steps") is not None:
                    steps_seen.add(int(summary["steps"]))
                w = walls.setdefault(entry, {"run": [], "rl": []})
                w["run"].append(float(summary.get("elapsed_s", 0.0)))
                w["rl"].append(float(summary.get("rl_s", summary.get("elapsed_s", 0.0))))
                records = read_metrics(d / "metrics.jsonl")  # read once: curves, sharing counts and examples
                curves, sharing, examples = _curves(records), _sharing_counts(records), _hint_examples(records)
                entropy = _entropy_ends(records)
                if (edges := _edge_totals(records)):
                    edge_runs.setdefault(entry, []).append(edges)
                fmt = _answer_format(d)
                _note_precisions(precisions, left_to_auto, _precisions(d, summary), _chosen_dtypes(d),
                                 f"{entry} seed {seed}")
                for policy, p in summary["policies"].items():
                    evals = read_evals(d / "evals" / f"{policy}.jsonl")
                    first_h, last_h = entropy.get(policy, (None, None))
                    per.setdefault(entry, {}).setdefault(policy, {})[seed] = {
                        "final": p["final_accuracy"], "start": p["warm_start_accuracy"],
                        "curve": curves.get(policy, []),
                        "rollouts": p.get("rollouts", 0),
                        "correct": correct_by_problem(evals[-1]) if evals else None,
                        "style": {"start": {**answer_style(evals[0]["texts"], fmt), "sampled_entropy": first_h},
                                  "final": {**answer_style(evals[-1]["texts"], fmt), "sampled_entropy": last_h}}
                                 if evals else None,
                        "sharing": sharing.get(policy),
                        "hint_examples": examples.get(policy, []),
                    }
        pair_out: dict = {}
        base = per.get(spec.baseline, {})
        for entry, policies in per.items():
            pair_out[entry] = {}
            for policy, seeds in policies.items():
                pair_out[entry][policy] = _policy_row(seeds, base.get(policy, {}), entry == spec.baseline)
        results["pairs"][pair] = pair_out
        results["steps_by_pair"][pair] = sorted(steps_seen)
        # a mix the entries asked for (a precision compare sets model.dtype per entry) is the point, not a confound
        results.setdefault("mixed_precision_by_pair", {})[pair] = {
            p: v for p, v in precisions.items() if len(v) > 1 and p in left_to_auto}
        results["wall_by_pair"][pair] = {e: {"run_s": ci95(w["run"]), "rl_s": ci95(w["rl"])} for e, w in walls.items()}
        results.setdefault("edges_by_pair", {})[pair] = {
            e: {edge: _mean_counts([r.get(edge) or {} for r in runs]) for edge in sorted({k for r in runs for k in r})}
            for e, runs in edge_runs.items()}
    results["compute"] = compute(spec, out)
    results["tracking"] = tracking_links(out)
    return results


def tracking_links(out: Path) -> dict:
    """Where the compare's runs can be looked at in a tracker: the TensorBoard command over every run's event
    files (each run's directory names its entry, pair and seed), and the MLflow run they nest under."""
    links: dict = {}
    if any(out.glob("runs/*/*/*/tensorboard")):
        links["tensorboard"] = f"tensorboard --logdir {out / 'runs'}"
    f = out / "tracking.json"
    if f.is_file():
        try:
            links.update({k: v for k, v in json.loads(f.read_text()).items() if v})
        except json.JSONDecodeError:
            pass
    return links


def compute(spec: CompareSpec, out: Path) -> dict:
    """What the finished runs cost: their count, the sum of their wall times, and the wall time of
    the compare itself: each invocation from its start to the last run it finished (its logged
    events, and the summary.json times of runs finished after it started and before the next one
    did, so a run whose event was never written still counts)."""
    finished = [run_dir(out, e, p, s) / "summary.json" for e, p, s in spec.runs()]
    finished = [f for f in finished if f.is_file()]
    runs = [json.loads(f.read_text()) for f in finished]
    sessions: dict[float, list[float]] = {}
    jobs: set[int] = set()
    log = out / SESSIONS
    for line in log.read_text().splitlines() if log.is_file() else []:
        try:
            rec = json.loads(line)
            sessions.setdefault(float(rec["session"]), [float(rec["session"])]).append(float(rec["t"]))
            if rec.get("event") == "start":
                jobs.add(int(rec.get("jobs", 1)))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by a kill mid-write
    starts = sorted(sessions)
    for f in finished:
        t = f.stat().st_mtime
        owner = [s for s in starts if s <= t]
        if owner:
            sessions[owner[-1]].append(t)
    return {
        "runs": len(runs), "of": len(spec.runs()),
        "run_seconds": round(sum(r.get("elapsed_s", 0.0) for r in runs), 1),
        "wall_seconds": round(sum(max(ts) - s for s, ts in sessions.items()), 1),
        "invocations": len(sessions), "jobs": sorted(jobs),
    }


def format_ci(x: dict | None, pct: bool = True, signed: bool = False) -> str:
    """A ``ci95`` summary as the report writes it: ``mean ± half-width`` in points (``pct``), "–" for none."""
    if x is None:
        return "–"
    m, h = x["mean"], x["ci95"]
    if pct:
        mean = f"{m * 100:+.1f}" if signed else f"{m * 100:.1f}"
        return mean if h is None else f"{mean} ± {h * 100:.1f}"
    return f"{m:.2f}" if h is None else f"{m:.2f} ± {h:.2f}"


def summary_table(results: dict, pair: str) -> str:
    """One pair as a compact table — an entry per row, a policy per column, final held-out accuracy
    (mean ± 95 % CI) and its paired difference against the baseline: what the README shows."""
    entries = results["pairs"].get(pair, {})
    policies = sorted({p for e in entries.values() for p in e})
    rows = ["| entry | " + " | ".join(policies) + " |", "|---|" + "---|" * len(policies)]
    for entry, per in entries.items():
        cells = []
        for policy in policies:
            r = per.get(policy)
            if r is None:
                cells.append("–")
                continue
            d = r["paired_vs_baseline"]
            delta = f" ({format_ci(d, signed=True)})" if d else ""
            cells.append(format_ci(r["final_accuracy"]) + delta + f", n={len(r['seeds'])}")
        rows.append(f"| {entry} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def _steps_text(results: dict) -> str:
    """The RL steps per run: the compare's own budget, else what each pair's runs recorded."""
    if results.get("steps"):
        return f"{results['steps']} RL steps"
    by_pair = {p: "/".join(map(str, v)) for p, v in (results.get("steps_by_pair") or {}).items() if v}
    if not by_pair:
        return "RL steps from each pair's config"
    return "RL steps per pair: " + ", ".join(f"{p} {v}" for p, v in by_pair.items())


def report_md(results: dict) -> str:
    """The compare's report as Markdown: one table per pair, every entry and policy with its confidence intervals."""
    lines = [f"# {results['name']}", "",
             f"Seeds {results['seeds']}, {_steps_text(results)}; baseline `{results['baseline']}`. "
             "Accuracy is held-out greedy accuracy (points); ± is a 95 % confidence interval over seeds (Student's t). "
             "Rollouts-to-target: rollouts an entry needs to reach the baseline's final accuracy, over the baseline's "
             "(never reaching it counts as twice the budget). Paired: entry − baseline on the same seeds.", ""]
    c = results.get("compute")
    if c:
        lines += [f"Compute: {c['runs']} of {c['of']} runs, {c['run_seconds'] / 3600:.2f} h of run time; the compare "
                  f"took {c['wall_seconds'] / 3600:.2f} h of wall time over {c['invocations']} invocation(s) with "
                  f"--jobs {'/'.join(map(str, c['jobs'])) or '–'}.", ""]
    for pair, entries in results["pairs"].items():
        policies = sorted({p for e in entries.values() for p in e})
        lines += [f"## {pair}", "",
                  "| entry | policy | final accuracy | gain | AUC | rollouts to target (×) | paired vs baseline |",
                  "|---|---|---|---|---|---|---|"]
        for entry, per in entries.items():
            for policy in policies:
                r = per.get(policy)
                if r is None:
                    continue
                lines.append(f"| {entry} | {policy} | {format_ci(r['final_accuracy'])} | "
                             f"{format_ci(r['gain'], signed=True)} | "
                             f"{format_ci(r['auc'])} | {format_ci(r['rollouts_to_target_ratio'], pct=False)} | "
                             f"{format_ci(r['paired_vs_baseline'], signed=True)} |")
        mixed = (results.get("mixed_precision_by_pair") or {}).get(pair) or {}
        if mixed:
            lines += ["**Warning: these runs did not all train in the same precision** (`model.dtype: auto` resolves "
                      "by the machine's CPU); a difference between entries may be the precision's: " + "; ".join(
                          f"{p}: " + ", ".join(f"{prec} ({', '.join(runs)})" for prec, runs in v.items())
                          for p, v in mixed.items()) + ".", ""]
        lines += ["", *_efficiency_lines(results, entries), *_wall_lines(results, pair),
                  *_detail_lines(entries, policies), *_edge_lines((results.get("edges_by_pair") or {}).get(pair)),
                  *_example_lines(entries, policies)]
    links = results.get("tracking") or {}
    if links:
        lines += ["## In a tracker", ""]
        if "tensorboard" in links:
            lines.append(f"- TensorBoard, every run side by side (filter runs by `<entry>/<pair>/seed<n>`): "
                         f"`{links['tensorboard']}`")
        if "mlflow_url" in links or "mlflow_run_id" in links:
            lines.append(f"- MLflow: the compare's run {links.get('mlflow_url') or links['mlflow_run_id']}, each run a "
                         "child tagged entry, pair and seed")
        lines.append("")
    return "\n".join(lines) + "\n"


def _efficiency_lines(results: dict, entries: dict) -> list[str]:
    """The efficiency claim for the policy the spec named: rollouts to the baseline's mean final accuracy, each entry
    against the baseline itself (both with their intervals), and the ratio of their means."""
    policy, baseline = results.get("efficiency_policy"), results["baseline"]
    base = (entries.get(baseline) or {}).get(policy, {}).get("rollouts_to_baseline_mean")
    if not policy or not base:
        return []

    def needs(x: dict) -> str:
        r = x["rollouts"]
        spread = "" if r["ci95"] is None else f" ± {r['ci95']:.0f}"
        return f"{r['mean']:.0f}{spread} rollouts (reached in {x['reached']} of {x['runs']} runs)"

    rows = []
    for entry, per in entries.items():
        x = (per.get(policy) or {}).get("rollouts_to_baseline_mean")
        if entry == baseline or not x:
            continue
        b = base["rollouts"]["mean"]
        ratio = f"{x['rollouts']['mean'] / b:.2f}×" if b > 0 else "– (the baseline starts at its target)"
        rows.append(f"| {entry} | {needs(x)} | {needs(base)} | {ratio} |")
    if not rows:  # only the baseline has finished runs yet
        return []
    return [f"Efficiency, `{policy}` (named in the spec before the runs): rollouts to reach `{baseline}`'s mean "
            f"final accuracy ({base['target'] * 100:.1f} %); a run that never reaches it counts as twice its budget.",
            "", "| entry | rollouts to target | baseline's | ratio of means |", "|---|---|---|---|", *rows, ""]


def _shared(c: dict | None) -> bool:
    """Whether a run's sharing counts show any rescue at all (SGT's or SGT-R's)."""
    return bool(c and (c.get("rescue_samples") or c.get("rescue_count")))


def _rescue_weight_text(c: dict) -> str:
    """SGT-R's rescued tokens' mean weight, the shares at its floor and cap, and the gate's Δ, where recorded."""
    text = ""
    if c.get("hint_weight_mean") is not None:
        floor, cap = c.get("hint_floored_frac", 0.0), c.get("hint_capped_frac", 0.0)
        text = (f"; rescued tokens' weight {c['hint_weight_mean']:.2f} (at the floor {floor * 100:.0f} %, at the cap "
                f"{cap * 100:.0f} %)")
    if c.get("hint_delta_mean") is not None:
        text += f"; gate Δ {c['hint_delta_mean']:+.1f} nats"
    return text


def _sharing_text(c: dict | None) -> str:
    """One entry's sharing per run: SGT-R's hints, rescue samples and trained rescues (< 1 trained a step is "not
    exercised"), or SGT's rescues."""
    if not _shared(c):
        return "–"
    if c.get("rescue_samples"):
        note = "" if c["trained_per_step"] >= 1 else " — **not exercised** (< 1 trained rescue a step)"
        return (f"hints {c['hints_offered']:.0f} (gated out {c['hints_gated_out']:.0f}, masked "
                f"{c['hints_masked']:.0f}, refused {c['hints_refused']:.0f}); samples {c['rescue_samples']:.0f}, "
                f"rescued {c['rescued']:.0f}, trained {c['rescue_trained']:.0f} ({c['trained_per_step']:.1f} a "
                f"step){_rescue_weight_text(c)}{note}")
    return f"SGT rescues {c['rescue_count']:.0f}"


def _detail_lines(entries: dict, policies: list[str]) -> list[str]:
    """Per entry and policy: the per-problem paired difference, answer style at the start and at the end, and how
    much sharing the runs did (an entry whose receiver trained < 1 rescue a step is "not exercised")."""
    rows = [(e, p, per[p]) for e, per in entries.items() for p in policies if p in per]
    if not any(r.get("style") or r.get("per_problem_vs_baseline") or _shared(r.get("sharing")) for _, _, r in rows):
        return []

    def style(st: dict | None) -> str:
        if not st or st.get("chars") is None:
            return "–"
        text = f"{st['chars']:.0f} ch, {st['in_form'] * 100:.0f} % in form, {st['shows_work'] * 100:.0f} % work"
        if st.get("sampled_entropy") is not None:
            text += f", sampled entropy {st['sampled_entropy']:.2f} nats/token"
        return text

    def problems(x: dict | None) -> str:
        if x is None:
            return "–"
        if x.get("per_seed_sets"):  # each seed its own held-out set: (seed, problem) pairs are the units
            return f"{format_ci(x, signed=True)} ({x['problems']} seed-problem pairs over {x['seeds']} seeds)"
        return f"{format_ci(x, signed=True)} ({x['problems']} problems × {x['seeds']} seeds)"

    out = ["Answers at the start and at the end: the first and the last held-out evaluation's greedy answers (mean "
           "length, share in the task's form, share that show work), and where the records have it the sampling "
           "entropy of the first and the last step's own rollouts (mean −log π of their tokens).", "",
           "| entry | policy | per-problem paired vs baseline | answers at the start | answers at the end | "
           "sharing per run (mean) |", "|---|---|---|---|---|---|"]
    for e, p, r in rows:
        st = r.get("style") or {}
        out.append(f"| {e} | {p} | {problems(r.get('per_problem_vs_baseline'))} | {style(st.get('start'))} | "
                   f"{style(st.get('final'))} | {_sharing_text(r.get('sharing'))} |")
    return [*out, ""]


EDGE_COLUMNS = ("offered", "used", "stale", "thl_rejected", "rescues", "hints_offered", "hints_masked",
                "hints_refused", "rescue_samples", "rescued", "rescue_trained")
"""The per-edge counts the report shows (the sharing dashboard's, summed over a run)."""


def _edge_lines(edges: dict | None) -> list[str]:
    """Per entry and sharing edge, what flowed on it in a run (mean over the entry's runs): the graph's evidence
    that every edge carried something, or which did not."""
    if not edges:
        return []
    out = ["Sharing per edge (sums over a run, mean over the entry's runs; recorded where the experiment names its "
           "edges):", "", "| entry | edge | " + " | ".join(c.replace("_", " ") for c in EDGE_COLUMNS) + " |",
           "|---|---|" + "---|" * len(EDGE_COLUMNS)]
    for entry, per in edges.items():
        for edge, c in per.items():
            out.append(f"| {entry} | {edge} | " + " | ".join(f"{c[k]:.0f}" if k in c else "–" for k in EDGE_COLUMNS)
                       + " |")
    return [*out, ""]


def _cell(text: str | None, limit: int = 160) -> str:
    """A text as one Markdown table cell: newlines shown as ⏎, pipes escaped, cut to ``limit`` characters."""
    if text is None:
        return "–"
    t = text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", "").replace("\n", " ⏎ ").strip()
    return (t[:limit] + " …") if len(t) > limit else (t or "(empty)")


def _example_lines(entries: dict, policies: list[str]) -> list[str]:
    """Per entry and receiving policy, the hints its peers' successes became and the rescue sample the receiver
    wrote from each (verified ones first): the report's evidence of what a rescue looked like, not only its count."""
    out: list[str] = []
    for e, per in entries.items():
        for p in policies:
            exs = (per.get(p) or {}).get("hint_examples") or []
            if not exs:
                continue
            if not out:
                out += ["### Example hints and rescue samples", "",
                        "The first seed's, up to five per edge, verified rescue samples first. A hint of – is a plain "
                        "resample (no hint text); Δ is the information gate's log-probability gain (– when not "
                        "measured).", ""]
            out += [f"**{e}, {p}**", "", "| step | from | hint | Δ | rescue sample | verified |",
                    "|---|---|---|---|---|---|"]
            for x in exs:
                delta = "–" if x.get("delta") is None else f"{float(x['delta']):+.2f}"
                out.append(f"| {x.get('step', '–')} | {x.get('source')} | {_cell(x.get('hint'))} | {delta} | "
                           f"{_cell(x.get('sample'))} | {'yes' if float(x.get('reward') or 0) > 0 else 'no'} |")
            out.append("")
    return out


def _wall_lines(results: dict, pair: str) -> list[str]:
    """The wall time of one run of each entry (mean ± 95 % CI over seeds): the RL part and the whole run."""
    walls = (results.get("wall_by_pair") or {}).get(pair)
    if not walls:
        return []
    def sec(x: dict) -> str:
        return f"{x['mean']:.0f}" + (f" ± {x['ci95']:.0f}" if x["ci95"] is not None else "")

    cells = [f"{e} {sec(w['rl_s'])} s ({sec(w['run_s'])} s with warm start and evaluation)" for e, w in walls.items()]
    return ["Wall time of one run's RL: " + "; ".join(cells) + ".", ""]


def plot_curves(spec: CompareSpec, out: Path, results: dict) -> list[Path]:
    """Held-out accuracy against rollouts per policy, mean over seeds with a 95 % band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for pair in spec.pairs:
        policies = sorted({p for e in results["pairs"].get(pair, {}).values() for p in e})
        if not policies:
            continue
        fig, axes = plt.subplots(1, len(policies), figsize=(6 * len(policies), 4), squeeze=False)
        for ax, policy in zip(axes[0], policies):
            for entry in spec.entries:
                curves = []
                for seed in spec.seeds:
                    d = run_dir(out, entry, pair, seed)
                    if (d / "summary.json").is_file():
                        c = _curves(read_metrics(d / "metrics.jsonl")).get(policy)
                        if c:
                            curves.append(sorted(c))
                if not curves:
                    continue
                n = min(len(c) for c in curves)
                xs = [curves[0][i][0] for i in range(n)]
                stats = [ci95([c[i][1] for c in curves]) for i in range(n)]
                ys = [s["mean"] for s in stats]
                hw = [s["ci95"] or 0.0 for s in stats]
                ax.plot(xs, ys, label=entry)
                ax.fill_between(xs, [y - h for y, h in zip(ys, hw)], [y + h for y, h in zip(ys, hw)], alpha=0.15)
            ax.set_title(f"{pair}: {policy}")
            ax.set_xlabel("rollouts")
            ax.set_ylabel("held-out accuracy")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        path = out / f"curves-{pair}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def write_report(spec: CompareSpec, out: Path) -> dict:
    """Analyse the finished runs and write ``results.json``, ``report.md`` and the curves; return the results."""
    results = analyse(spec, out)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "report.md").write_text(report_md(results))
    plot_curves(spec, out, results)
    return results
