"""What a tracker is sent, as pure functions: a step's metrics record as named scalars, a config as flat
parameters. Every backend logs the same names (the list is docs/tracking.md, "Logged keys").

A record is one policy's line of ``metrics.jsonl``. Its numbers are grouped by what a reader looks for:
``train/`` (the loss and its statistics), ``eval/``, ``time/``, ``throughput/``, ``thl/`` (retokenisation
residuals), ``sharing/`` (what crossed the exchange), ``edge/<source>/`` (one incoming sharing edge) and
``progress/``; fields this module does not know go to ``other/`` rather than being lost.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

# record field -> logged name; a field missing here and numeric lands in other/<field>
NAMES: dict[str, str] = {
    "reward_mean": "train/reward_mean",
    "loss": "train/loss",
    "kl": "train/kl",
    "approx_kl": "train/approx_kl",
    "clip_frac": "train/clip_frac",
    "grad_norm": "train/grad_norm",
    "ratio_mean": "train/ratio_mean",
    "ratio_max": "train/ratio_max",
    "sgt_nll": "train/sgt_nll",
    "own_sampled_nll": "train/sampled_entropy",
    "updates": "train/updates",
    "empty_updates": "train/empty_updates",
    "tokens": "train/tokens",
    "eval_accuracy": "eval/accuracy",
    "step_s": "time/step_s",
    "gen_s": "time/gen_s",
    "rescue_count": "sharing/rescues",
    "gate_open": "sharing/gate_open",
    "shared_in": "sharing/shared_in",
    "shared_out": "sharing/shared_out",
    "peer_rows": "sharing/peer_rows_used",
    "peer_candidates": "sharing/peer_candidates",
    "peer_rescored": "sharing/peer_rescored",
    "own_rollouts": "progress/own_rollouts",
    "rollouts": "progress/rollouts",
    "weights_version": "progress/weights_version",
    "weights_bytes": "progress/weights_bytes",
    # SGT-R's rescue round (docs/algorithms.md §3.5)
    **{k: f"sharing/sgt_r/{k}" for k in ("hints_offered", "hints_gated_out", "hints_masked", "hints_refused",
                                         "rescue_samples", "rescued", "rescue_trained", "rescue_cut_off",
                                         "rescue_verified_nothing",
                                         "hint_delta_mean", "hint_weight_mean", "hint_floored_frac",
                                         "hint_capped_frac")},
}
BY_REASON = {"peer_rejected": "sharing/rejected", "hint_refused": "sharing/sgt_r/refused"}
"""Record fields that count by reason: logged as ``<prefix>/<reason>``."""
SKIPPED = {"step", "policy", "phase", "wall_time", "peers_quarantined", "reputation_events", "skipped", "hint_examples"}
"""Fields that are the x-axis, labels or event lists (events go to the service log, not a chart)."""

BY_ROLLOUTS = ("reward_mean", "eval_accuracy")
"""Also logged against rollouts sampled (``by_rollouts/<field>``, step = rollouts), the x-axis on which
policies of different group sizes compare."""


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)) and math.isfinite(v):
        return float(v)
    return None


def _nested(key: str, value: dict) -> dict[str, float]:
    """A record's dict-valued field as scalars: stage times, counts by reason, THL residuals per source."""
    if key == "stage_seconds":
        return {f"time/{stage}_s": x for stage, v in value.items() if (x := _number(v)) is not None}
    if key == "stage_peak_rss_gib":
        return {f"memory/{stage}_peak_gib": x for stage, v in value.items() if (x := _number(v)) is not None}
    if key in BY_REASON:
        out = {f"{BY_REASON[key]}/{why}": x for why, v in value.items() if (x := _number(v)) is not None}
        if key == "peer_rejected":
            out["sharing/peer_rows_rejected"] = float(sum(_number(v) or 0 for v in value.values()))
        return out
    if key == "thl_by_source":
        return {f"edge/{source}/{f}": x for source, fields in value.items() if isinstance(fields, dict)
                for f, v in fields.items() if (x := _number(v)) is not None}
    return {}


def scalars(record: dict) -> dict[str, float]:
    """A metrics record as ``{name: value}``: finite numbers only (a NaN loss of an empty update is not a
    point), nested sections flattened, incoming edges under ``edge/<source>/``."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in SKIPPED:
            continue
        if isinstance(value, dict):
            out.update(_nested(key, value))
        elif key.startswith("thl_"):
            if (x := _number(value)) is not None:
                out[f"thl/{key.removeprefix('thl_')}"] = x
        elif (x := _number(value)) is not None:
            out[NAMES.get(key, f"other/{key}")] = x
    tokens, step_s = _number(record.get("tokens")), _number(record.get("step_s"))
    if tokens is not None and step_s:
        out["throughput/tokens_per_s"] = tokens / step_s
    return out


def by_rollouts(record: dict) -> tuple[int, dict[str, float]] | None:
    """The fields logged against rollouts sampled, and that x; None when the record has no rollouts count."""
    rollouts = record.get("rollouts")
    if not isinstance(rollouts, int) or isinstance(rollouts, bool):
        return None
    values = {f"by_rollouts/{f}": x for f in BY_ROLLOUTS if (x := _number(record.get(f))) is not None}
    return (rollouts, values) if values else None


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"a.b.c": value}``; list items by index (``policies.0.name``)."""
    items: Iterable[tuple[Any, Any]]
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in items:
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    if not out and prefix:
        out[prefix] = "[]" if isinstance(tree, (list, tuple)) else "{}"
    return out


def params(config: dict) -> dict[str, str | int | float | bool]:
    """The resolved config as hyperparameters a tracker can filter on: scalars kept, None as "null"."""
    return {k: ("null" if v is None else v if isinstance(v, (str, int, float, bool)) else str(v))
            for k, v in flatten(config).items()}


def summary_scalars(summary: dict) -> dict[str, float]:
    """A policy's entry of ``summary.json`` as ``final/<field>`` numbers."""
    return {f"final/{k}": x for k, v in summary.items() if (x := _number(v)) is not None}
