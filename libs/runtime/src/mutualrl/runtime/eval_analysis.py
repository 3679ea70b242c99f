"""What a run's per-problem evaluations (``evals/<policy>.jsonl``) say beyond an accuracy: a paired comparison of two
entries problem by problem, and the style of the answers (length, form, whether the work is shown, and their shape).

The per-problem paired difference is the question "on the same held-out problems and the same seeds, how much more
often does this entry answer correctly than the baseline": for each problem the mean over seeds of
``correct_entry − correct_baseline``, then a 95 % t-interval over the problems (the problems are the sampling unit:
with 256 of them the interval is far narrower than one over 3–5 seeds' accuracies, and a seed's run-to-run noise
is averaged inside each problem's value).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from mutualrl.runtime.compare_stats import ci95
from mutualrl.tasks.answers import extract_answer

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_SPACE = re.compile(r"\s+")
SHAPE_CHARS = 60  # a shape longer than this is cut: long reasoning has no shared shape worth naming in a table


def read_evals(path: Path) -> list[dict]:
    """A run's evaluations of one policy, in step order ([] when the run kept none)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a kill mid-write
    return sorted(out, key=lambda e: e.get("step", 0))


def correct_by_problem(evaluation: dict) -> dict[str, int]:
    """{prompt id: 1 or 0} of one evaluation."""
    return {pid: int(c) for pid, c in zip(evaluation.get("prompt_ids", []), evaluation.get("correct", ""))}


def per_problem_paired(entry: dict[int, dict[str, int]], baseline: dict[int, dict[str, int]]) -> dict | None:
    """The per-problem paired difference (module docstring) over the seeds both have: ``ci95`` of the differences,
    with ``problems`` and ``seeds`` counted. When every seed evaluated the same held-out problems, each problem's
    difference is its mean over the seeds. When the held-out set changes with the seed (a task drawn per seed), each
    (seed, problem) pair is a unit of its own (``per_seed_sets``: True; ``problems`` counts the pairs): intersecting
    the seeds' sets would keep only the few problems they share by chance. None when nothing pairs."""
    seeds = sorted(set(entry) & set(baseline))
    if not seeds:
        return None
    common = {s: set(entry[s]) & set(baseline[s]) for s in seeds}
    shared = set.intersection(*common.values())
    if shared and len(shared) == min(len(c) for c in common.values()):
        diffs = [sum(entry[s][p] - baseline[s][p] for s in seeds) / len(seeds) for p in sorted(shared)]
        return {**ci95(diffs), "problems": len(shared), "seeds": len(seeds)}
    diffs = [float(entry[s][p] - baseline[s][p]) for s in seeds for p in sorted(common[s])]
    if not diffs:
        return None
    return {**ci95(diffs), "problems": len(diffs), "seeds": len(seeds), "per_seed_sets": True}


def per_problem_by_seed(entry: dict[int, dict[str, int]], baseline: dict[int, dict[str, int]]) -> dict[int, dict]:
    """Each seed's own per-problem paired difference (its problems as the units), for the seeds both have. The
    pooled figure above hides how far apart the seeds land: on a 256-problem set one seed's interval is ~±5 points,
    and a seed where the entry lost shows here while the mean over seeds stays positive."""
    out = {}
    for s in sorted(set(entry) & set(baseline)):
        if (one := per_problem_paired({s: entry[s]}, {s: baseline[s]})) is not None:
            out[s] = one
    return out


def answer_style(texts: list[str], answer_format: str, cut_off: str | None = None) -> dict[str, float | None]:
    """How a policy answers: mean length in characters, the share of answers in the required form (the format's
    parser reads an answer), the share that show work (at least three numbers: the operands and a result), and
    the share the token limit cut off (from an evaluation log's ``cut_off`` bits; None for logs written before
    them): a cut-off answer is an unfinished one, and a "pass" read from it may be a stray number."""
    if not texts:
        return {"chars": None, "in_form": None, "shows_work": None, "cut_off": None}
    n = len(texts)
    return {"chars": sum(len(t) for t in texts) / n,
            "in_form": sum(1 for t in texts if extract_answer(t, answer_format) not in (None, "")) / n,
            "shows_work": sum(1 for t in texts if len(_NUMBER.findall(t)) >= 3) / n,
            "cut_off": cut_off.count("1") / len(cut_off) if cut_off else None}


def answer_shape(text: str) -> str:
    """An answer with its numbers replaced by ``#`` and its whitespace collapsed: ``"9 + 5 equals 14."`` and
    ``"33 + 17 equals 40."`` share the shape ``"# + # equals #."``, which ``"9 + 5 = 14"`` does not. Length, form and
    shown work cannot tell those two apart; the shape is how a report sees a receiver take up a peer's wording."""
    shape = _SPACE.sub(" ", _NUMBER.sub("#", text)).strip()
    return shape if len(shape) <= SHAPE_CHARS else shape[:SHAPE_CHARS - 1] + "…"


def answer_shapes(texts: list[str], top: int = 3) -> dict[str, float]:
    """The ``top`` most common answer shapes (:func:`answer_shape`) with their shares, most common first (ties in
    first-seen order); {} for no texts."""
    counts = Counter(answer_shape(t) for t in texts)
    return {shape: n / len(texts) for shape, n in counts.most_common(top)}
