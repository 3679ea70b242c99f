"""Grafana dashboards as code: each panel is a title, a unit and PromQL over mutualrl's metrics.
`python -m mutualrl.app.dashboards` writes the JSON into the Helm chart (`files/dashboards`), which
ships it as ConfigMaps; the compose file provisions the same files; a test checks the files are this output, that
every expression parses (promtool) and that a real Prometheus scraping a real run returns data
for every metric the panels use.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Panel:
    """One Grafana panel: a title, its PromQL expressions and how to draw them."""
    title: str
    exprs: tuple[str, ...]
    unit: str = "short"
    legend: str = "{{policy}}"
    kind: str = "timeseries"
    # metrics only an external engine serves (vLLM, SGLang): not expected in a CPU run
    external: bool = False
    repeat: str | None = None  # a dashboard variable: one copy of the panel (or row) per value


@dataclass(frozen=True)
class Variable:
    """A dashboard variable: the values of one label of one metric (what repeated rows and panels iterate)."""
    name: str
    metric: str
    label: str


@dataclass(frozen=True)
class Dashboard:
    """One Grafana dashboard, rendered to the JSON the chart and compose provision."""
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)
    variables: tuple[Variable, ...] = ()


DASHBOARDS = (
    Dashboard("mutualrl-overview", "mutualrl / run overview",
              "Reward, held-out accuracy, step time by stage and tokens per second, per policy.", (
        Panel("Mean own reward (last step)", ("mutualrl_reward_mean",)),
        Panel("Held-out greedy accuracy", ("mutualrl_eval_accuracy_ratio",), unit="percentunit"),
        Panel("Learner step", ("mutualrl_step{role=\"learner\"}",)),
        Panel("Step time by stage (mean over 5m)",
              ("sum by (policy, stage) (rate(mutualrl_stage_seconds_sum[5m])) / sum by (policy, stage) "
               "(rate(mutualrl_stage_seconds_count[5m]))",),
              unit="s", legend="{{policy}} {{stage}}"),
        Panel("Tokens per second", ("sum by (policy, role) (rate(mutualrl_stage_tokens_total[5m]))",), unit="short",
              legend="{{policy}} {{role}}"),
        Panel("Rollouts published per second", ("sum by (policy) (rate(mutualrl_rollouts_total[5m]))",)),
    )),
    Dashboard("mutualrl-balance", "mutualrl / balance (MWRA)",
              "GPUs each policy and role holds against its step time, idle share per role, peer lag and re-plans.", (
        Panel("GPUs allocated", ("mutualrl_mwra_allocated_gpus",), legend="{{policy}} {{role}}"),
        Panel("Predicted step seconds", ("mutualrl_mwra_predicted_step_seconds",), unit="s"),
        Panel("Measured step seconds (generate vs train)",
              ("sum by (policy, stage) (rate(mutualrl_stage_seconds_sum{stage=~\"generate|train\"}[5m])) / sum by "
               "(policy, stage) (rate(mutualrl_stage_seconds_count{stage=~\"generate|train\"}[5m]))",),
              unit="s", legend="{{policy}} {{stage}}"),
        Panel("Idle ratio per role (time not in its own stage)", (
            "1 - clamp_max(sum by (policy) (rate(mutualrl_stage_seconds_sum{role=\"rollout\"}[5m])), 1)",
            "1 - clamp_max(sum by (policy) (rate(mutualrl_stage_seconds_sum{role=\"learner\"}[5m])), 1)",
        ), unit="percentunit", legend="{{policy}}"),
        Panel("Peer lag (steps)", ("mutualrl_staleness_steps",), legend="{{policy}} {{role}}"),
        Panel("Plan / lower bound", ("mutualrl_mwra_plan_lower_bound_ratio",), legend="plan"),
        Panel("Re-plans", ("sum by (reason) (increase(mutualrl_mwra_replans_total[1h]))",), legend="{{reason}}"),
        Panel("Partial-gang GPU-seconds (must stay 0)", ("mutualrl_mwra_partial_gang_gpu_seconds_total",),
              legend="partial"),
        Panel("Gang admission wait p90",
              ("histogram_quantile(0.9, sum by (le) (rate(mutualrl_mwra_gang_admission_wait_seconds_bucket[1h])))",),
              unit="s", legend="p90"),
    )),
    Dashboard("mutualrl-sharing", "mutualrl / sharing (SEE)",
              "Experience published and consumed, consumer lag, dead letters, peer rejections by reason and rescues.", (
        Panel("Published per second by kind", ("sum by (kind) (rate(mutualrl_see_published_total[5m]))",),
              legend="{{kind}}"),
        Panel("Consumed per second by receiver", ("sum by (receiver) (rate(mutualrl_see_consumed_total[5m]))",),
              legend="{{receiver}}"),
        Panel("Consumer-group lag", ("max by (stream, group) (mutualrl_see_group_lag)",),
              legend="{{group}} ← {{stream}}"),
        Panel("Dead letters", ("max by (namespace) (mutualrl_see_dead_letters)",), legend="{{namespace}}"),
        Panel("Dead-lettered per second by reason", ("sum by (reason) (rate(mutualrl_see_dead_lettered_total[5m]))",),
              legend="{{reason}}"),
        Panel("Peer rejections by reason", ("sum by (policy, reason) (rate(mutualrl_peer_rejected_total[5m]))",),
              legend="{{policy}} {{reason}}"),
        Panel("Peer experience used per second", ("sum by (policy) (rate(mutualrl_shared_in_total[5m]))",)),
        Panel("Rescues (SGT) per second", ("sum by (policy) (rate(mutualrl_rescues_total[5m]))",)),
        Panel("SGT-R hints refused, and rescue rounds without samples, by reason",
              ("sum by (policy, reason) (rate(mutualrl_hint_refused_total[5m]))",), legend="{{policy}} {{reason}}"),
        Panel("Verified successes shared per second", ("sum by (policy) (rate(mutualrl_shared_out_total[5m]))",)),
        Panel("HACPO cross rows per second: below the ratio's lower bound (no gradient) or not",
              ("sum by (policy, where) (rate(mutualrl_hacpo_cross_rows_total[5m]))",), legend="{{policy}} {{where}}"),
        # the sharing graph: a row per receiving learner, in it a panel per incoming edge
        Panel("Edges into $receiver", (), kind="row", repeat="receiver"),
        Panel("Edge $source → $receiver: offered, used, stale, refused by THL, rescues; SGT-R hints and rescue samples "
              "(per second)",
              ("sum by (event) (rate(mutualrl_edge_messages_total{policy=~\"$receiver\", source=~\"$source\"}[5m]))",),
              legend="{{event}}", repeat="source"),
    ), variables=(Variable("receiver", "mutualrl_edge_messages_total", "policy"),
                  Variable("source", "mutualrl_edge_messages_total", "source"))),
    Dashboard("mutualrl-alignment", "mutualrl / alignment health (THL)",
              "Per receiving policy and source policy (one tokenizer pair each): what retokenisation could not carry "
              "over.", (
        Panel("Unaligned byte fraction", ("mutualrl_thl_unaligned_ratio",), unit="percentunit",
              legend="{{source}} → {{policy}}"),
        Panel("Log-prob residual (nats per message)", ("mutualrl_thl_logprob_residual_nats",),
              legend="{{source}} → {{policy}}"),
        Panel("Round-trip failures per converted message", (
            "sum by (policy, source) (rate(mutualrl_thl_roundtrip_failures_total[5m])) / clamp_min(sum by (policy, "
            "source) (rate(mutualrl_thl_messages_total[5m])), 1e-9)",),
              unit="percentunit", legend="{{source}} → {{policy}}"),
        Panel("Length ratio (target / source tokens)", ("mutualrl_thl_length_ratio",),
              legend="{{source}} → {{policy}}"),
        Panel("THL rejections",
              ("sum by (policy, reason) (rate(mutualrl_peer_rejected_total{reason=~\"thl_.*|text_mismatch\"}[5m]))",),
              legend="{{policy}} {{reason}}"),
    )),
    Dashboard("mutualrl-weights", "mutualrl / weight sync",
              "Seconds per published version, bytes per version, and how far each engine's weights trail its learner.",
              (
        Panel("Weight sync seconds (p50, p90)", (
            "histogram_quantile(0.5, sum by (policy, le) "
            "(rate(mutualrl_stage_seconds_bucket{stage=\"weight_sync\"}[10m])))",
            "histogram_quantile(0.9, sum by (policy, le) "
            "(rate(mutualrl_stage_seconds_bucket{stage=\"weight_sync\"}[10m])))",
        ), unit="s"),
        Panel("Bytes per version", ("mutualrl_weights_bytes",), unit="bytes"),
        Panel("Weights version (learner published, rollout served)", ("mutualrl_weights_version",),
              legend="{{policy}} {{role}}"),
        Panel("Versions behind per engine", ("mutualrl_staleness_steps{role=\"rollout\"}",)),
    )),
    Dashboard("mutualrl-engines", "mutualrl / engines",
              "Our rollout servers' view, and vLLM's and SGLang's own metrics when those engines serve the rollouts.", (
        Panel("Generate latency p90 (rollout server)",
              ("histogram_quantile(0.9, sum by (policy, le) (rate(mutualrl_rollout_generate_seconds_bucket[5m])))",),
              unit="s"),
        Panel("Completion tokens per second (rollout server)",
              ("sum by (policy) (rate(mutualrl_rollout_tokens_total[5m]))",)),
        Panel("RolloutService calls by code",
              ("sum by (policy, method, code) (rate(mutualrl_rollout_requests_total[5m]))",),
              legend="{{policy}} {{method}} {{code}}"),
        Panel("vLLM generation tokens per second", ("sum by (model_name) (rate(vllm:generation_tokens_total[5m]))",),
              legend="{{model_name}}", external=True),
        Panel("vLLM requests running / waiting",
              ("sum by (model_name) (vllm:num_requests_running)", "sum by (model_name) (vllm:num_requests_waiting)"),
              legend="{{model_name}}", external=True),
        # vLLM's V1 engine name; the old vllm:gpu_cache_usage_perc was deprecated, then removed
        Panel("vLLM KV-cache usage", ("avg by (model_name) (vllm:kv_cache_usage_perc)",), unit="percentunit",
              legend="{{model_name}}", external=True),
        Panel("SGLang generation throughput", ("sum by (model_name) (sglang:gen_throughput)",), legend="{{model_name}}",
              external=True),
        Panel("SGLang running requests", ("sum by (model_name) (sglang:num_running_reqs)",), legend="{{model_name}}",
              external=True),
        Panel("SGLang KV-cache usage", ("avg by (model_name) (sglang:token_usage)",), unit="percentunit",
              legend="{{model_name}}", external=True),
    )),
)

_METRIC = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{|\[|\))")
_NOT_METRICS = {"sum", "rate", "increase", "max", "min", "avg", "by", "clamp_max", "clamp_min", "histogram_quantile",
                "changes", "on", "and"}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads (what must return data in a live scrape)."""
    names = {m for m in _METRIC.findall(expr) if m not in _NOT_METRICS}
    bare = re.findall(r"(?<![\w:{\"])([a-z][a-z0-9_:]*_[a-z0-9_:]+)(?![\w(])", expr)
    names |= {b for b in bare if b not in _NOT_METRICS and (b.startswith("mutualrl_") or ":" in b)}
    return {n for n in names if n.startswith(("mutualrl_", "vllm:", "sglang:"))}


def to_grafana(d: Dashboard) -> dict:
    """One dashboard as Grafana JSON (panels on a grid, a Prometheus datasource variable)."""
    panels = []
    for i, p in enumerate(d.panels):
        if p.kind == "row":
            panels.append({"id": i + 1, "type": "row", "title": p.title, "collapsed": False, "panels": [],
                           "gridPos": {"h": 1, "w": 24, "x": 0, "y": 8 * (i // 2 + 1)}, "repeat": p.repeat})
            continue
        repeat = {"repeat": p.repeat, "repeatDirection": "h"} if p.repeat else {}
        panels.append({**repeat,
            "id": i + 1, "type": p.kind, "title": p.title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
            "targets": [{"refId": chr(ord("A") + j), "expr": e, "legendFormat": p.legend,
                         "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                        for j, e in enumerate(p.exprs)],
        })
    return {
        "uid": d.uid, "title": d.title, "description": d.description, "tags": ["mutualrl"], "schemaVersion": 39,
        "version": 1,
        "editable": True, "time": {"from": "now-1h", "to": "now"}, "refresh": "30s",
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus"}] + [
            {"name": v.name, "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": f"label_values({v.metric}, {v.label})", "refId": v.name},
             "definition": f"label_values({v.metric}, {v.label})", "multi": True, "includeAll": True,
             "current": {"text": "All", "value": "$__all"}, "refresh": 2}
            for v in d.variables]},
        "panels": panels,
    }


def render_all() -> dict[str, str]:
    """Every dashboard's JSON file, by file name."""
    return {f"{d.uid}.json": json.dumps(to_grafana(d), indent=2, sort_keys=True) + "\n" for d in DASHBOARDS}


def all_exprs(include_external: bool = True) -> list[tuple[str, str]]:
    """Every panel's PromQL expression with its dashboard and title (the tests check each against a real Prometheus)."""
    return [(f"{d.uid}: {p.title}", e)
            for d in DASHBOARDS for p in d.panels if include_external or not p.external for e in p.exprs]


def main(argv: list[str]) -> int:
    """Write the dashboards into the chart's folder (or the one given)."""
    out = Path(argv[0] if argv else "deploy/helm/mutualrl/files/dashboards")
    out.mkdir(parents=True, exist_ok=True)
    for name, text in render_all().items():
        (out / name).write_text(text)
    print(f"wrote {len(DASHBOARDS)} dashboards to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
