"""A compare's ``results.json`` as a Markdown report (a table per pair with confidence intervals, efficiency, wall
time, answer style, sharing per run and per edge, example hints) and as curves of held-out accuracy against rollouts.
"""

from __future__ import annotations

import json
from pathlib import Path

from mutualrl.app.compare import CompareSpec, run_dir
from mutualrl.app.compare_analysis import analyse, eval_curves
from mutualrl.runtime.compare_stats import ci95
from mutualrl.runtime.outputs import read_metrics


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
        edges = (results.get("edges_by_pair") or {}).get(pair)
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
        hosts = (results.get("mixed_hosts_by_pair") or {}).get(pair) or {}
        if hosts:
            lines += ["**Warning: a seed's runs came from different machines**, and bf16 rounds differently across "
                      "CPUs, so a paired difference at that seed may be the machines' rather than the entries': "
                      + "; ".join(
                          f"seed {seed}: " + ", ".join(f"{', '.join(runs)} on {host}" for host, runs in by.items())
                          for seed, by in hosts.items()) + ". Run a seed's entries on one kind of machine.", ""]
        lines += ["", *_efficiency_lines(results, entries), *_wall_lines(results, pair),
                  *_detail_lines(entries, policies, edges), *_edge_lines(edges),
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
    """Whether a run's sharing counts show any rescue at all (SGT's or SGT-R's) or any HACPO cross row."""
    return bool(c and (c.get("rescue_samples") or c.get("rescue_count") or c.get("cross_rows")))


def _rescue_weight_text(c: dict) -> str:
    """SGT-R's mean weight of rescue samples' tokens toward the hint-free policy (over every rescue sample: a row that
    verifies nothing has no advantage, whatever its weight), the shares at its floor and cap, and the gate's Δ."""
    text = ""
    if c.get("hint_weight_mean") is not None:
        floor, cap = c.get("hint_floored_frac", 0.0), c.get("hint_capped_frac", 0.0)
        text = (f"; rescue samples' token weight {c['hint_weight_mean']:.2f} (at the floor {floor * 100:.0f} %, at "
                f"the cap {cap * 100:.0f} %)")
    if c.get("hint_delta_mean") is not None:
        text += f"; gate Δ {c['hint_delta_mean']:+.1f} nats"
    return text


def _not_exercised(per_step: float, what: str) -> str:
    """The issue's rule for every mode's row: a receiver that trained fewer than one of ``what`` on average is "not
    exercised" (never "no harm" or a gain)."""
    return "" if per_step >= 1 else f" — **not exercised** (< 1 {what})"


def _sharing_text(c: dict | None, alone: bool = False) -> str:
    """One entry's sharing per run: SGT-R's hints, rescue samples and trained rescues (< 1 trained a step is "not
    exercised"), SGT's rescues (the peer successes its NLL trained on; < 1 a step is "not exercised" too), or HACPO's
    cross rows and how many sat below the ratio's lower bound, where they have no gradient (< 1 a step not below it
    is "not exercised" too); for a policy that learns ``alone`` in the entry, that its difference is noise."""
    if not _shared(c):
        return "receives nothing (no edge into it): its paired difference is the runs' own variation" if alone else "–"
    if c.get("cross_rows"):  # HACPO's runs (no other mode records cross rows)
        below, rest = c["cross_below_bound"], c["cross_not_below_per_step"]
        return (f"HACPO cross rows {c['cross_rows']:.0f}, {below:.0f} below the ratio's lower bound "
                f"({below / c['cross_rows'] * 100:.0f} %, no gradient): at most {rest:.1f} a step trained"
                f"{_not_exercised(rest, 'cross row a step not below the bound')}")
    if c.get("rescue_samples"):
        return (f"hints {c['hints_offered']:.0f} (gated out {c['hints_gated_out']:.0f}, masked "
                f"{c['hints_masked']:.0f}, refused {c['hints_refused']:.0f}); samples {c['rescue_samples']:.0f}, "
                f"rescued {c['rescued']:.0f}, trained {c['rescue_trained']:.0f} ({c['trained_per_step']:.1f} a "
                f"step){_cut_off_text(c)}{_rescue_weight_text(c)}"
                f"{_not_exercised(c['trained_per_step'], 'trained rescue a step')}")
    per_step = c.get("rescues_per_step", 0.0)
    note = _not_exercised(per_step, "trained success a step")
    return f"SGT rescues {c['rescue_count']:.0f} ({per_step:.1f} a step){note}"


def _cut_off_text(c: dict) -> str:
    """The verified rescues left untrained because the token limit cut them off (§3.5), where a run had any."""
    n = c.get("rescue_cut_off") or 0
    return f", {n:.0f} verified but cut off (not trained)" if n else ""


def _receives_nothing(edges: dict | None, policy: str) -> bool:
    """Whether an entry's named sharing edges leave ``policy`` without one into it: it then learns alone in that
    entry, and its paired difference against the baseline is the runs' own variation (sampling paths, float
    rounding), the floor a receiver's difference is read against."""
    return bool(edges) and not any(edge.rsplit("->", 1)[-1] == policy for edge in edges)


def _shapes_text(shapes: dict[str, float] | None, floor: float = 0.05) -> str:
    """The answers' shapes worth naming: the most common always, the next ones from ``floor`` of the answers; a
    shape sits in a code span, a ``|`` in it escaped for the table (GFM) and a backtick made a quote; an empty answer
    (no code span can hold it) is named "(empty)"."""
    if not shapes:
        return ""
    parts = []
    for i, (shape, share) in enumerate(shapes.items()):
        if i == 0 or share >= floor:
            code = shape.replace("`", "'").replace("|", "\\|")
            parts.append(f"`{code}` {share * 100:.0f} %" if code.strip() else f"(empty) {share * 100:.0f} %")
    return ", ".join(parts)


def _detail_lines(entries: dict, policies: list[str], edges: dict | None = None) -> list[str]:
    """Per entry and policy: the per-problem paired difference, answer style at the start and at the end, and how
    much sharing the runs did (an entry whose receiver trained < 1 rescue a step, or kept < 1 HACPO cross row a step
    not below the ratio's lower bound, is "not exercised"; a policy no edge of the entry reaches is named as learning
    alone, its paired difference the runs' noise)."""
    rows = [(e, p, per[p]) for e, per in entries.items() for p in policies if p in per]
    if not any(r.get("style") or r.get("per_problem_vs_baseline") or _shared(r.get("sharing")) for _, _, r in rows):
        return []

    def style(st: dict | None) -> str:
        if not st or st.get("chars") is None:
            return "–"
        text = f"{st['chars']:.0f} ch, {st['in_form'] * 100:.0f} % in form, {st['shows_work'] * 100:.0f} % work"
        if st.get("cut_off") is not None:
            text += f", {st['cut_off'] * 100:.0f} % cut off"
        if st.get("sampled_entropy") is not None:
            text += f", sampled entropy {st['sampled_entropy']:.2f} nats/token"
        if shapes := _shapes_text(st.get("shapes")):
            text += f"; {shapes}"
        return text

    def problems(x: dict | None, by_seed: dict | None) -> str:
        if x is None:
            return "–"
        # per_seed_sets: each seed had its own held-out set, so (seed, problem) pairs are the units
        units = (f"{x['problems']} seed-problem pairs over {x['seeds']} seeds" if x.get("per_seed_sets")
                 else f"{x['problems']} problems × {x['seeds']} seeds")
        text = f"{format_ci(x, signed=True)} ({units})"
        if by_seed:  # results.json's keys are strings once read back
            text += "; by seed: " + ", ".join(f"{s} {format_ci(by_seed[s], signed=True)}"
                                             for s in sorted(by_seed, key=int))
        return text

    out = ["Answers at the start and at the end: the first and the last held-out evaluation's greedy answers (mean "
           "length, share in the task's form, share that show work), where the records have it the sampling "
           "entropy of the first and the last step's own rollouts (mean −log π of their tokens), and the answers' "
           "most common shapes (numbers as #) with their shares over the runs. The per-problem paired difference "
           "averages each problem's difference over the seeds; with two seeds or more each seed's own follows (its "
           "problems the units), so a seed where the entry lost shows beside a positive mean.", "",
           "| entry | policy | per-problem paired vs baseline | answers at the start | answers at the end | "
           "sharing per run (mean) |", "|---|---|---|---|---|---|"]
    for e, p, r in rows:
        st = r.get("style") or {}
        sharing = _sharing_text(r.get("sharing"), _receives_nothing((edges or {}).get(e), p))
        paired = problems(r.get("per_problem_vs_baseline"), r.get("per_problem_by_seed"))
        out.append(f"| {e} | {p} | {paired} | {style(st.get('start'))} | {style(st.get('final'))} | {sharing} |")
    return [*out, ""]


EDGE_COLUMNS = ("offered", "used", "stale", "thl_rejected", "rescues", "hints_offered", "hints_masked",
                "hints_refused", "rescue_samples", "rescued", "rescue_trained", "rescue_cut_off")
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


def _verified_text(example: dict) -> str:
    """Whether a rescue sample verified, and whether the token limit cut it off (recorded since 2026-12-06)."""
    verified = "yes" if float(example.get("reward") or 0) > 0 else "no"
    return f"{verified} (cut off)" if example.get("cut_off") else verified


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
                           f"{_cell(x.get('sample'))} | {_verified_text(x)} |")
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


def accuracy_band(means: list[float], half_widths: list[float]) -> tuple[list[float], list[float]]:
    """The plotted 95 % band of an accuracy curve, kept inside [0, 1]: with two or three seeds Student's t makes the
    interval wider than the scale (±12.7 standard errors at two), and an unclipped band stretched the axis from −1 to 2
    and flattened every curve on it. The report's tables keep the interval as computed."""
    lower = [max(0.0, m - h) for m, h in zip(means, half_widths)]
    upper = [min(1.0, m + h) for m, h in zip(means, half_widths)]
    return lower, upper


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
                        c = eval_curves(read_metrics(d / "metrics.jsonl")).get(policy)
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
                ax.fill_between(xs, *accuracy_band(ys, hw), alpha=0.15)
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
