"""The statistics of `mutualrl compare` (pure functions over plain numbers).

- ``ci95``: mean and the half-width of a 95 % confidence interval of the mean, from Student's t
  with n − 1 degrees of freedom (seeds are few: a normal 1.96 would claim too much).
- ``rollouts_to_target``: the rollouts a policy spent before its held-out accuracy first reached a
  target, interpolated linearly between evaluations (None when it never did).
- ``auc``: the area under accuracy-against-rollouts, divided by the rollouts covered (the mean
  accuracy over training, so runs of one budget compare directly).
- ``paired``: differences of an entry against the baseline on the same seeds, with their ci95
  (pairing removes the between-seed variance both share).
- ``pool``: ci95 of several disjoint samples known only by their summaries (seeds added later).
"""

from __future__ import annotations

import math
from typing import Sequence

# two-sided 95 % quantiles of Student's t, degrees of freedom 1..30 (beyond: the normal 1.960)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """Student's t quantile 0.975 for ``df`` degrees of freedom (the normal 1.96 beyond the table)."""
    if df < 1:
        raise ValueError("a confidence interval needs at least two values")
    return _T975[df - 1] if df <= len(_T975) else 1.960


def ci95(values: Sequence[float]) -> dict[str, float | int | None]:
    """{"mean", "ci95" (half-width; None for one value), "n", "std"}."""
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("no values")
    n = len(xs)
    mean = sum(xs) / n
    if n == 1:
        return {"mean": mean, "ci95": None, "n": 1, "std": None}
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return {"mean": mean, "ci95": t975(n - 1) * std / math.sqrt(n), "n": n, "std": std}


def rollouts_to_target(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """First rollouts at which the accuracy curve ``[(rollouts, accuracy), ...]`` reaches ``target``."""
    pts = sorted(curve)
    if not pts:
        return None
    if pts[0][1] >= target:
        return pts[0][0]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if y1 >= target:
            return x0 + (x1 - x0) * (target - y0) / (y1 - y0) if y1 != y0 else x1
    return None


def auc(curve: Sequence[tuple[float, float]]) -> float:
    """Trapezoid area under accuracy over rollouts, divided by the rollouts covered."""
    pts = sorted(curve)
    if len(pts) < 2 or pts[-1][0] == pts[0][0]:
        return pts[0][1] if pts else 0.0
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(pts, pts[1:]))
    return area / (pts[-1][0] - pts[0][0])


def paired(entry: dict[int, float], baseline: dict[int, float]) -> dict[str, float | int | None]:
    """ci95 of ``entry[seed] − baseline[seed]`` over the seeds both have."""
    seeds = sorted(set(entry) & set(baseline))
    if not seeds:
        raise ValueError("no seed in common")
    return ci95([entry[s] - baseline[s] for s in seeds])


def pool(parts: Sequence[dict]) -> dict[str, float | int | None]:
    """ci95 of the union of disjoint samples, each given only as ``ci95``'s summary (mean, std, n).

    Why: a compare's results.json keeps a summary per entry and policy, not always the runs, so more seeds
    run later (another spec, other seeds) are pooled from the summaries. Exact, not an approximation: the
    union's sum of squares is each part's (n − 1)·std² plus n·(mean − pooled mean)²."""
    parts = [p for p in parts if p and p.get("n")]
    if not parts:
        raise ValueError("nothing to pool")
    n = sum(int(p["n"]) for p in parts)
    mean = sum(int(p["n"]) * float(p["mean"]) for p in parts) / n
    if n == 1:
        return {"mean": mean, "ci95": None, "n": 1, "std": None}
    squares = sum((int(p["n"]) - 1) * float(p["std"] or 0.0) ** 2 + int(p["n"]) * (float(p["mean"]) - mean) ** 2
                  for p in parts)
    std = math.sqrt(squares / (n - 1))
    return {"mean": mean, "ci95": t975(n - 1) * std / math.sqrt(n), "n": n, "std": std}
