"""A compare's finished runs read into ``results.json``: per pair, entry and policy the final accuracy, gain and AUC
over seeds, rollouts-to-target, paired and per-problem paired differences against the baseline, answer style,
sharing counts per run and per edge, hint examples, precisions, wall time and what the compare cost.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from mutualrl.app.compare import SESSIONS, CompareSpec, run_dir, run_label
from mutualrl.runtime.compare_stats import auc, ci95, paired, rollouts_to_target
from mutualrl.runtime.eval_analysis import (
    answer_shapes,
    answer_style,
    correct_by_problem,
    per_problem_by_seed,
    per_problem_paired,
    read_evals,
)
from mutualrl.runtime.host import host_key
from mutualrl.runtime.outputs import read_metrics
from mutualrl.services.learner.step_record import cross_rows_split


def eval_curves(records: list[dict]) -> dict[str, list[tuple[float, float]]]:
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
                  "rescued", "rescue_trained", "rescue_cut_off")
"""Per-run sums of a policy's step records that say whether a mode was exercised at all."""


RESCUE_MEANS = ("hint_weight_mean", "hint_floored_frac", "hint_capped_frac", "hint_delta_mean")
"""SGT-R's per-step means (a rescue sample token's weight toward the hint-free policy, the shares of tokens at its floor
and its cap, the information gate's Δ) that a run's figure averages over the steps that had any: why a receiver did or
did not learn from its rescues."""


def _sharing_counts(records: list[dict]) -> dict[str, dict[str, float]]:
    """Per policy: the run's sums of :data:`SHARING_COUNTS`, its steps, SGT-R's trained rescues and SGT's trained
    successes per step, each of :data:`RESCUE_MEANS` as its mean over the steps that recorded it (absent when none
    did), and where HACPO took cross rows, their sum, those below the ratio's lower bound (no gradient under its hard
    clamp, docs/algorithms.md §2.7) and those a step left not below it (the most that trained: the clamp also holds a
    row above 1)."""
    out: dict[str, dict[str, float]] = {}
    means: dict[str, dict[str, list[float]]] = {}
    for rec in records:
        if rec.get("phase") == "warm_start" or not rec.get("step"):
            continue
        c = out.setdefault(rec["policy"], {k: 0.0 for k in (*SHARING_COUNTS, "steps")})
        c["steps"] += 1
        for k in SHARING_COUNTS:
            c[k] += float(rec.get(k) or 0)
        if (split := cross_rows_split(rec)) is not None:
            c["cross_below_bound"] = c.get("cross_below_bound", 0.0) + split[0]
            c["cross_rows"] = c.get("cross_rows", 0.0) + split[0] + split[1]
        for k in RESCUE_MEANS:
            if isinstance(rec.get(k), (int, float)):
                means.setdefault(rec["policy"], {}).setdefault(k, []).append(float(rec[k]))
    for policy, c in out.items():
        c["trained_per_step"] = c["rescue_trained"] / c["steps"] if c["steps"] else 0.0
        c["rescues_per_step"] = c["rescue_count"] / c["steps"] if c["steps"] else 0.0
        if "cross_rows" in c:
            c["cross_not_below_per_step"] = (c["cross_rows"] - c["cross_below_bound"]) / c["steps"]
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


def _mean_shapes(runs: list[dict[str, float]], top: int = 3) -> dict[str, float]:
    """Answer shapes' shares averaged over runs (a shape a run lacks is 0 in it), the ``top`` largest first: one
    seed whose receiver took up a peer's wording shows as that wording's share of the entry's runs."""
    shares = _mean_counts([r for r in runs if r]) or {}
    return dict(sorted(shares.items(), key=lambda kv: -kv[1])[:top])


def _mean_style(runs: list[dict]) -> dict | None:
    """Answer style (start and final evaluation; the sampling entropy of the first and last step) averaged over an
    entry's runs, each figure over the runs that have it; answer shapes by :func:`_mean_shapes`."""
    if not runs:
        return None
    return {when: {k: _mean_shapes([r[when].get(k) or {} for r in runs]) if k == "shapes"
                   else _mean_present([r[when].get(k) for r in runs])
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
    by_seed = per_problem_by_seed(correct, b_correct) if not is_baseline else {}
    row["per_problem_by_seed"] = by_seed if len(by_seed) > 1 else None  # one seed: the pooled figure is that seed's
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
        hosts: dict[int, dict[str, list[str]]] = {}  # seed -> machine -> the entries that ran it there
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
                curves, sharing, examples = eval_curves(records), _sharing_counts(records), _hint_examples(records)
                entropy = _entropy_ends(records)
                if (edges := _edge_totals(records)):
                    edge_runs.setdefault(entry, []).append(edges)
                fmt = _answer_format(d)
                _note_precisions(precisions, left_to_auto, _precisions(d, summary), _chosen_dtypes(d),
                                 f"{entry} seed {seed}")
                if (host := host_key(summary.get("host"))) is not None:
                    hosts.setdefault(seed, {}).setdefault(host, []).append(entry)
                for policy, p in summary["policies"].items():
                    evals = read_evals(d / "evals" / f"{policy}.jsonl")
                    first_h, last_h = entropy.get(policy, (None, None))
                    per.setdefault(entry, {}).setdefault(policy, {})[seed] = {
                        "final": p["final_accuracy"], "start": p["warm_start_accuracy"],
                        "curve": curves.get(policy, []),
                        "rollouts": p.get("rollouts", 0),
                        "correct": correct_by_problem(evals[-1]) if evals else None,
                        "style": {"start": {**answer_style(evals[0]["texts"], fmt, evals[0].get("cut_off")),
                                            "sampled_entropy": first_h,
                                            "shapes": answer_shapes(evals[0]["texts"])},
                                  "final": {**answer_style(evals[-1]["texts"], fmt, evals[-1].get("cut_off")),
                                            "sampled_entropy": last_h,
                                            "shapes": answer_shapes(evals[-1]["texts"])}}
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
        # runs paired seed by seed should share a machine: bf16 rounds differently across CPUs
        results.setdefault("mixed_hosts_by_pair", {})[pair] = {
            seed: by_host for seed, by_host in sorted(hosts.items()) if len(by_host) > 1}
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
    the compare itself: each invocation from its start to the last run it finished. That is its
    logged events; a finished run whose event was never written (killed between its summary.json and
    the log line) counts by its summary.json's time, in the last invocation that started before it. A
    logged run's file time is not used: where runs were copied (committed records), it is the copy's."""
    labelled = [(run_label(e, p, s), run_dir(out, e, p, s) / "summary.json") for e, p, s in spec.runs()]
    labelled = [(label, f) for label, f in labelled if f.is_file()]
    runs = [json.loads(f.read_text()) for _, f in labelled]
    sessions: dict[float, list[float]] = {}
    logged: set[str] = set()
    jobs: set[int] = set()
    log = out / SESSIONS
    for line in log.read_text().splitlines() if log.is_file() else []:
        try:
            rec = json.loads(line)
            sessions.setdefault(float(rec["session"]), [float(rec["session"])]).append(float(rec["t"]))
            if rec.get("event") == "start":
                jobs.add(int(rec.get("jobs", 1)))
            elif rec.get("event") == "run":
                logged.add(str(rec.get("run")))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by a kill mid-write
    starts = sorted(sessions)
    for label, f in labelled:
        t = f.stat().st_mtime
        owner = [s for s in starts if s <= t]
        if owner and label not in logged:
            sessions[owner[-1]].append(t)
    return {
        "runs": len(runs), "of": len(spec.runs()),
        "run_seconds": round(sum(r.get("elapsed_s", 0.0) for r in runs), 1),
        "wall_seconds": round(sum(max(ts) - s for s, ts in sessions.items()), 1),
        "invocations": len(sessions), "jobs": sorted(jobs),
    }
