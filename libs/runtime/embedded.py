"""The embedded run: every policy's rollout worker and learner in one process.

Workers and learners talk only through SEE (in-process backend) and the
rollout-engine interface — the boundaries the services use — so splitting
them into processes swaps transports, not logic.
"""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from contextlib import ExitStack, contextmanager
from typing import Callable, Iterator

import torch

from mutualrl.config import ConfigError, ExperimentConfig, dump_config
from mutualrl.models.families import ModelShape
from mutualrl.models.policy import PolicyArtifacts, default_cache_dir, load_policy
from mutualrl.runtime.distributor import PromptDistributor
from mutualrl.runtime.evaluation import greedy_accuracy
from mutualrl.runtime.outputs import MetricsWriter, plot_curves, read_metrics, save_checkpoint
from mutualrl.runtime.warm_start import warm_start
from mutualrl.runtime.exchange_setup import open_exchange
from mutualrl.services.learner import Learner, LearnerSettings, PeerIntake, TokenizerRegistry
from mutualrl.services.rollout import RolloutWorker, SamplingSpec, WeightStore
from mutualrl.services.rollout.engine import RolloutEngine
from mutualrl.services.rollout.factory import build_engine, probe_engine
from mutualrl.services.rollout.http_engines import EngineUnavailable
from mutualrl.tasks import Task, Verifier, build_task, build_verifier
from mutualrl.thl import ThlBudget


@contextmanager
def _input_errors(what: str) -> Iterator[None]:
    """Failures while *loading* user-named inputs (files that are missing or malformed, paths
    that are not models) are input problems: re-raise them as ConfigError, which the CLI
    prints as one line. Errors anywhere else keep their type and traceback."""
    try:
        yield
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e


@contextmanager
def _engine_errors(policy: str) -> Iterator[None]:
    """An engine server that is absent or lacks a capability is a setup problem: one line, exit 2."""
    try:
        yield
    except EngineUnavailable as e:
        raise ConfigError(f"policy {policy!r}: {e}") from e


def build_task_from_config(cfg: ExperimentConfig) -> tuple[Task, Verifier]:
    t = cfg.task
    common = {"seed": cfg.seed, "eval_size": t.eval_size}
    if t.name == "arithmetic":
        task = build_task("arithmetic", train_size=t.train_size, min_digits=t.min_digits, max_digits=t.max_digits, operators=t.operators, **common)
    elif t.name == "countdown":
        task = build_task("countdown", train_size=t.train_size, num_numbers=t.num_numbers, max_number=t.max_number, **common)
    else:
        task = build_task("jsonl", path=t.path, train_size=t.train_size, **common)
    return task, build_verifier(t.verifier, task)


@dataclass
class PolicyRuntime:
    name: str
    artifacts: PolicyArtifacts
    worker: RolloutWorker
    learner: Learner
    engine: RolloutEngine
    warm_accuracy: float
    warm_steps: int


class Reporter:
    """Receives progress events; the CLI plugs a live display in, tests a no-op."""

    def phase(self, text: str) -> None: ...

    def step(self, step: int, total: int, records: list[dict]) -> None: ...


def run_embedded(cfg: ExperimentConfig, out_dir: Path, reporter: Reporter | None = None, cache_dir: Path | None = None) -> dict:
    """Train every policy for ``budget.steps`` and write the run's outputs; the SEE broker
    (and a local Redis server, when one is started for the run) lives as long as the run."""
    with ExitStack() as stack:
        return _run(cfg, out_dir, reporter, cache_dir, stack)


def _run(cfg: ExperimentConfig, out_dir: Path, reporter: Reporter | None, cache_dir: Path | None, stack: ExitStack) -> dict:
    rep = reporter or Reporter()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(max(1, min(torch.get_num_threads(), os.cpu_count() or 1)))
    out_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, out_dir / "config.yaml")
    metrics_path = out_dir / "metrics.jsonl"
    metrics_path.write_text("")
    writer = MetricsWriter(metrics_path)
    cache = cache_dir or default_cache_dir()

    rep.phase(f"building task {cfg.task.name}")
    with _input_errors(f"task {cfg.task.name}"):
        task, verifier = build_task_from_config(cfg)
    eval_set = task.eval[: cfg.eval.size]
    max_new = cfg.budget.max_new_tokens

    for p in cfg.policies:  # pre-flight: an absent engine server fails before any model work
        if p.engine.backend != "hf":
            with _engine_errors(p.name):
                probe_engine(p.engine)
    rep.phase(f"opening the experience exchange ({cfg.broker.backend})")
    exchange = stack.enter_context(open_exchange(cfg))
    # external engines (vllm, sglang) read weights from disk; in-process ones share memory
    store = WeightStore(out_dir / "weights") if any(p.engine.backend != "hf" for p in cfg.policies) else WeightStore()
    registry = TokenizerRegistry()
    names = [p.name for p in cfg.policies]

    runtimes: list[PolicyRuntime] = []
    for i, p in enumerate(cfg.policies):
        rep.phase(f"[{p.name}] loading model")
        with _input_errors(f"policy {p.name!r}"):
            arts = load_policy(
                path=p.model.path,
                family=p.model.family,
                shape=ModelShape(p.model.hidden_size, p.model.num_layers, p.model.num_heads, p.model.intermediate_size, p.model.max_positions),
                tokenizer_path=p.tokenizer.path,
                tokenizer_kind=p.tokenizer.kind,
                vocab_size=p.tokenizer.vocab_size,
                corpus=task.corpus,
                corpus_fingerprint=task.fingerprint(),
                seed=cfg.seed + i,
                cache_dir=cache,
            )
        arts.model.to(p.engine.device)
        registry.register(arts.fingerprint, arts.tokenizer)
        ws_acc, ws_steps = float("nan"), 0
        if p.warm_start.enabled:
            rep.phase(f"[{p.name}] warm start (target {p.warm_start.target_accuracy:.0%})")
            ws = warm_start(
                arts.model, arts.tokenizer, task.train, task.eval, verifier, p.warm_start,
                source=arts.source, task_fingerprint=task.fingerprint(), seed=cfg.seed + i,
                max_new_tokens=max_new, cache_dir=cache, chat_template=p.tokenizer.chat_template,
                on_progress=lambda s, a, n=p.name: rep.phase(f"[{n}] warm start step {s}: held-out {a:.1%}"),
            )
            ws_steps = ws.steps
        rep.phase(f"[{p.name}] evaluating the starting point")
        ws_acc = greedy_accuracy(arts.model, arts.tokenizer, eval_set, verifier, max_new, chat_template=p.tokenizer.chat_template)
        with _engine_errors(p.name):
            engine = build_engine(p.engine, arts.model, arts.tokenizer, store, p.model.path or arts.source)
        spec = SamplingSpec(n=cfg.budget.group_size, max_new_tokens=max_new, temperature=p.engine.temperature, top_k=p.engine.top_k, top_p=p.engine.top_p)
        worker = RolloutWorker(p.name, engine, arts.tokenizer, verifier, exchange, fingerprint=arts.fingerprint, sampling=spec, seed=cfg.seed, chat_template=p.tokenizer.chat_template)
        ref = None
        if cfg.algorithm.kl_coef > 0:
            ref = copy.deepcopy(arts.model).eval()
            for q in ref.parameters():
                q.requires_grad_(False)
        intake = PeerIntake(arts.tokenizer, verifier, registry, ThlBudget(cfg.thl.max_unaligned, cfg.thl.require_roundtrip), cfg.sharing.max_version_lag, p.tokenizer.chat_template, cfg.thl.placement)
        settings = LearnerSettings(group_size=cfg.budget.group_size, algorithm=cfg.algorithm, sharing=cfg.sharing, optim=p.optim, max_new_tokens=max_new, device=p.engine.device, peer_deadline_s=5.0)
        learner = Learner(p.name, arts.model, arts.tokenizer, exchange, intake, store, settings, peers=[n for n in names if n != p.name], ref_model=ref)
        runtimes.append(PolicyRuntime(p.name, arts, worker, learner, engine, ws_acc, ws_steps))

    weights_sub = {rt.name: exchange.subscribe(f"{rt.name}-rollout", ["weights_published"], [rt.name]) for rt in runtimes}
    distributor = PromptDistributor(task.train, cfg.budget.prompts_per_step, seed=cfg.seed)
    for rt in runtimes:
        writer.write({"step": 0, "policy": rt.name, "rollouts": 0, "eval_accuracy": rt.warm_accuracy, "phase": "warm_start"})

    rep.phase("training")
    recent: list[dict] = []
    last_eval: dict[str, float] = {rt.name: rt.warm_accuracy for rt in runtimes}
    for step in range(1, cfg.budget.steps + 1):
        problems = distributor.batch(step)
        gen = {}
        for rt in runtimes:
            t0 = time.monotonic()
            gen[rt.name] = (rt.worker.run_step(step, problems), time.monotonic() - t0)
        recent = []
        for rt in runtimes:
            rec = rt.learner.train_step(step, problems)
            # the rollout side loads the version the learner announced (write, then publish, then load)
            for m in weights_sub[rt.name].poll():
                wp = m.payload
                rt.engine.update_weights(wp.version, wp.uri, wp.checksum)
                store.acknowledge(rt.name, wp.version)
                weights_sub[rt.name].ack([m])
            roll, gen_s = gen[rt.name]
            rec.update(
                rollouts=rt.worker.total_rollouts,
                shared_out=roll.successes_published,
                gen_s=gen_s,
                step_s=gen_s + rec.pop("train_s", 0.0),
            )
            if step % cfg.eval.every == 0 or step == cfg.budget.steps:
                acc = greedy_accuracy(rt.learner.model, rt.artifacts.tokenizer, eval_set, verifier, max_new, chat_template=rt.worker.chat_template)
                rec["eval_accuracy"] = acc
                last_eval[rt.name] = acc
            writer.write(rec)
            recent.append(rec)
        rep.step(step, cfg.budget.steps, recent + [{"policy": n, "last_eval": a} for n, a in last_eval.items()])
    writer.close()

    rep.phase("writing checkpoints and summary")
    for rt in runtimes:
        save_checkpoint(
            out_dir / "checkpoints" / rt.name,
            rt.learner.model,
            rt.artifacts.tokenizer,
            rt.learner.opt,
            {"step": cfg.budget.steps, "weights_version": rt.learner.version, "policy": rt.name, "source": rt.artifacts.source},
        )
    records = read_metrics(metrics_path)
    plot_curves(records, out_dir / "curves.png", title=f"{cfg.name} — sharing: {cfg.sharing.mode}")
    summary = {
        "name": cfg.name,
        "sharing_mode": cfg.sharing.mode,
        "steps": cfg.budget.steps,
        "policies": {
            rt.name: {
                "source": rt.artifacts.source,
                "params": rt.artifacts.num_params,
                "tokenizer_fingerprint": rt.artifacts.fingerprint,
                "warm_start_steps": rt.warm_steps,
                "warm_start_accuracy": rt.warm_accuracy,
                "final_accuracy": last_eval[rt.name],
                "rollouts": rt.worker.total_rollouts,
                "rescue_count": rt.learner.totals["rescues"],
                "peer_rejections": {k.removeprefix("rejected_"): v for k, v in rt.learner.totals.items() if k.startswith("rejected_")},
            }
            for rt in runtimes
        },
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
