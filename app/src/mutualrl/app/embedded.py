"""The embedded run: every policy's rollout worker and learner in one process.

Workers and learners talk only through SEE (in-process backend) and the
rollout-engine interface — the boundaries the services use — so splitting
them into processes swaps transports, not logic.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from transformers.utils import logging as hf_logging

from mutualrl.app.resume_point import (
    PolicyResume,
    ResumePoint,
    config_fingerprint,
    discard_resume_point,
    keep_lines_until,
    load_resume_point,
    save_resume_point,
)
from mutualrl.config import ConfigError, ExperimentConfig, dump_config
from mutualrl.models.cache import default_cache_dir
from mutualrl.models.policy import PolicyArtifacts
from mutualrl.runtime.disk_budget import (
    check_room,
    learner_state_bytes,
    moment_bytes,
    parameter_bytes,
    run_disk_need,
    size_text,
    weight_store_need,
)
from mutualrl.runtime.distributor import PromptDistributor
from mutualrl.runtime.exchange_setup import open_exchange
from mutualrl.runtime.outputs import (
    MetricsWriter,
    plot_curves,
    policy_summary,
    read_metrics,
    save_checkpoint,
    write_summary,
)
from mutualrl.runtime.policy_setup import (
    PreparedPolicy,
    build_task_from_config,
    eval_log,
    evaluate,
    pass_rate_before_rl,
    prepare_policy,
)
from mutualrl.services.learner import Learner, SampledStep, StepRecord, TokenizerRegistry
from mutualrl.services.learner.loop import LearnerLoop
from mutualrl.services.learner.setup import make_learner
from mutualrl.services.rollout import RolloutWorker
from mutualrl.services.rollout.engine import RolloutEngine
from mutualrl.services.rollout.factory import build_engine, probe_engine
from mutualrl.services.rollout.http_engines import EngineUnavailable
from mutualrl.services.rollout.setup import engine_sampler, make_worker
from mutualrl.tracking import WarnOnce, open_tracker
from mutualrl.tracking.identity import new_group, run_info
from mutualrl.tracking.sink import RecordSink
from mutualrl.weights import WeightStore
from mutualrl.weights.handshake import WeightsFollower
from mutualrl.weights.shared import SharedModelSender


@contextmanager
def _engine_errors(policy: str) -> Iterator[None]:
    """An engine server that is absent or lacks a capability is a setup problem: one line, exit 2."""
    try:
        yield
    except EngineUnavailable as e:
        raise ConfigError(f"policy {policy!r}: {e}") from e


def _refused(policy: str):
    """In one process there is no older engine to fall back on: a refused version stops the run."""
    def fail(version: int, error: Exception) -> None:
        raise RuntimeError(f"policy {policy!r}: the rollout engine refused weights version {version}: "
                           f"{error}") from error
    return fail


@dataclass
class PolicyRuntime:
    """One policy inside `mutualrl run`: its rollout worker, learner and evaluation state in this process."""
    name: str
    artifacts: PolicyArtifacts
    worker: RolloutWorker
    learner: Learner
    loop: LearnerLoop
    engine: RolloutEngine
    warm_accuracy: float
    warm_steps: int
    pass_rate: dict | None = None  # the sampled pass rate before RL (pretrained policies), as summary.json keeps it
    precision: str = "float32"  # as resolved on this machine (model.dtype auto differs by CPU): summary.json keeps it
    rescue_rollouts: int = 0  # SGT-R rescue samples drawn by this invocation (a resumed run's earlier ones are in
    # the worker's count, restored from the resume point)

    @property
    def rollouts(self) -> int:
        """Every completion the policy's engine sampled for training: its groups and its rescue samples."""
        return self.worker.total_rollouts + self.rescue_rollouts


class Reporter:
    """Receives progress events; the CLI plugs a live display in, tests a no-op."""

    def phase(self, text: str) -> None:
        """A phase of the run started (building, warm start, evaluation)."""

    def step(self, step: int, total: int, records: list[StepRecord], last_eval: dict[str, float]) -> None:
        """Step ``step`` of ``total`` finished with these records; each policy's last held-out accuracy."""

    def note(self, text: str) -> None:
        """A line worth keeping on screen (where to watch the run)."""

    def warn(self, text: str) -> None:
        """Something the user should know that does not stop the run (a tracker down, say)."""
        print(text, file=sys.stderr, flush=True)


def _build_runtimes(cfg: ExperimentConfig, task, verifier, cache: Path, exchange, store: WeightStore,
                    rep: Reporter, out_dir: Path, resumed: ResumePoint | None = None) -> list[PolicyRuntime]:
    """Every policy prepared (loaded, warm-started), evaluated at its starting point and given its
    engine, rollout worker, learner and learner loop. Resumed, the starting point's numbers come from
    the resume point instead of being measured again."""
    registry = TokenizerRegistry()
    runtimes: list[PolicyRuntime] = []
    prepared = [prepare_policy(cfg, i, task, verifier, cache, rep.phase, rep.warn) for i in range(len(cfg.policies))]
    _check_disk(cfg, prepared, out_dir, resumed is not None, store)
    for pp in prepared:
        registry.register(pp.arts.fingerprint, pp.arts.tokenizer)
    for pp in prepared:
        p, arts = pp.config, pp.arts
        if resumed is not None:
            ws_acc, pass_rate = resumed.policies[p.name].warm_accuracy, resumed.policies[p.name].pass_rate
        else:
            rep.phase(f"[{p.name}] evaluating the starting point")
            ws_acc = evaluate(pp, arts.model, task, verifier, cfg, eval_log(out_dir, p.name), 0)
            if cfg.eval.pass_rate_check and p.model.path:
                rep.phase(f"[{p.name}] sampling its pass rate before RL")
            pass_rate = pass_rate_before_rl(pp, task, verifier, cfg, rep.warn)
        # synchronous and in-process: the engine samples the learner's own module (mutualrl.weights.shared)
        share = _shares_module(cfg, p)
        with _engine_errors(p.name):
            engine = build_engine(p.engine, arts.model, arts.tokenizer, store, p.model.path or arts.source,
                                  share=share, precision=pp.precision)
        worker = make_worker(cfg, pp, engine, exchange, verifier)
        learner = make_learner(cfg, pp, exchange, SharedModelSender() if share else store, registry, verifier,
                               # one process holds every policy: an update's freed pages serve the next update
                               rescue_sample=engine_sampler(engine, worker.sampling), shares_host=False)
        log = eval_log(out_dir, p.name)
        loop = LearnerLoop(learner, lambda model, step, pp=pp, log=log: evaluate(pp, model, task, verifier, cfg, log,
                                                                                step),
                           steps=cfg.budget.steps, eval_every=cfg.eval_every(p.name))
        runtimes.append(PolicyRuntime(p.name, arts, worker, learner, loop, engine, ws_acc, pp.warm_steps, pass_rate,
                                      precision=pp.precision.name))
    return runtimes


def _shares_module(cfg: ExperimentConfig, p) -> bool:
    """Whether policy ``p``'s engine samples its learner's own module (mutualrl.weights.shared): in-process and
    synchronous, so no weights version is copied or written."""
    return p.engine.facts.in_process and cfg.async_.max_staleness == 0 and cfg.weights.share_in_process


def _check_disk(cfg: ExperimentConfig, prepared: list[PreparedPolicy], out_dir: Path, resumed: bool,
                store: WeightStore) -> None:
    """Refuse, before any evaluation or step, a run whose directory's disk cannot hold its final checkpoints and
    resume points, and the weights versions it writes for server engines (mutualrl.runtime.disk_budget)."""
    state = sum(learner_state_bytes(pp.arts.model, moment_bytes(pp.config.optim.state_dtype)) for pp in prepared)
    need = run_disk_need(state, cfg.checkpoint.resume_every, cfg.budget.steps, resumed)
    points = " and resume points" if cfg.checkpoint.resume_every else ""
    what = (f"the final checkpoints{points} of {len(prepared)} policies' learners (weights and optimiser state, "
            f"{size_text(state)} a copy)")
    written = [pp for pp in prepared if store.root is not None and not _shares_module(cfg, pp.config)]
    if written:  # server engines read every version from disk (in-process ones then too)
        weights = sum(parameter_bytes(pp.arts.model) for pp in written)
        need += weight_store_need(weights, store.keep, resumed)
        what += f" and the weights versions engines read ({size_text(weights)} a version)"
    check_room(out_dir, need, what)


def _sample_ahead(cfg: ExperimentConfig, runtimes: list[PolicyRuntime], distributor: PromptDistributor, step: int,
                  sampled: dict[int, dict[str, SampledStep]], first: int = 1) -> None:
    """Sample every step up to ``step + async.max_staleness`` not sampled yet (docs/algorithms.md §6): with k = 0
    only ``step``, with the previous step's weights; with k > 0 the rollouts of step s are sampled with the
    weights of step s−1−k — the lag a pipelined service reaches once generation and training overlap."""
    last = min(step + cfg.async_.max_staleness, cfg.budget.steps)
    for s in range(max(sampled, default=first - 1) + 1, last + 1):
        problems = distributor.batch(s)
        sampled[s] = {}
        for rt in runtimes:
            t0 = time.monotonic()
            roll = rt.worker.run_step(s, problems)
            sampled[s][rt.name] = SampledStep(rt.worker.total_rollouts, roll.successes_published,
                                              time.monotonic() - t0)


def _train(cfg: ExperimentConfig, runtimes: list[PolicyRuntime], distributor: PromptDistributor,
           followers: dict[str, WeightsFollower], writer: RecordSink, rep: Reporter, last_eval: dict[str, float],
           first: int = 1, after_step=lambda step, last_eval: None) -> dict[str, float]:
    """The RL steps from ``first``: every policy samples the step's prompts (and, pipelined, the next k
    steps'), then each learner's loop trains on them and the rollout side loads the new weights;
    ``after_step(step, last_eval)`` once every policy trained the step (a resume point). Returns each
    policy's last held-out accuracy."""
    rep.phase("training" if first == 1 else f"training from step {first}")
    recent: list[StepRecord] = []
    sampled: dict[int, dict[str, SampledStep]] = {}  # step -> policy -> what its rollout side measured
    for step in range(first, cfg.budget.steps + 1):
        _sample_ahead(cfg, runtimes, distributor, step, sampled, first)
        problems = distributor.batch(step)
        recent = []
        for rt in runtimes:
            rec = rt.loop.step(step, problems, sampled[step][rt.name]).record
            rt.rescue_rollouts += rec.rescue_samples()  # the rescue round sampled after the step's groups
            if rec.rollouts is not None:
                rec.rollouts += rt.rescue_rollouts
            followers[rt.name].load_newest()
            if rec.eval_accuracy is not None:
                last_eval[rt.name] = rec.eval_accuracy
            writer.write(rec.to_dict())
            recent.append(rec)
        rep.step(step, cfg.budget.steps, recent, last_eval)
        after_step(step, last_eval)
    return last_eval


def _policy_summaries(runtimes: list[PolicyRuntime], last_eval: dict[str, float]) -> dict[str, dict]:
    """Each policy's entry of ``summary.json``."""
    return {
        rt.name: policy_summary(
            source=rt.artifacts.source, params=rt.artifacts.num_params, warm_start_steps=rt.warm_steps,
            warm_start_accuracy=rt.warm_accuracy, final_accuracy=last_eval[rt.name],
            rollouts=rt.rollouts,
            rescue_count=rt.learner.totals["rescues"],
            peer_rejections={k.removeprefix("rejected_"): v for k, v in rt.learner.totals.items()
                             if k.startswith("rejected_")},
            tokenizer_fingerprint=rt.artifacts.fingerprint, precision=rt.precision,
            **({"pass_rate_before_rl": rt.pass_rate} if rt.pass_rate is not None else {}),
        )
        for rt in runtimes
    }


class _Resumption:
    """A run's resume points (mutualrl.app.resume_point): the one it starts from, if its directory holds one,
    and the ones it writes every ``checkpoint.resume_every`` steps."""

    def __init__(self, cfg: ExperimentConfig, out_dir: Path, started: float):
        self.cfg, self.out_dir = cfg, out_dir
        self.fingerprint = config_fingerprint(cfg)  # the config as loaded: the run settles some settings later
        self.point = load_resume_point(out_dir, cfg)
        self.rl_before = self.point.rl_s if self.point is not None else 0.0
        self.elapsed_before = self.point.elapsed_s if self.point is not None else 0.0
        self.started = started
        self.rl_started = time.monotonic()
        self.runtimes: list[PolicyRuntime] = []

    @property
    def first_step(self) -> int:
        return self.point.step + 1 if self.point is not None else 1

    def records_so_far(self) -> list[dict]:
        """Resumed: the metrics records up to the resume point (to be written again), each policy's
        evaluation log cut there; a fresh run starts both empty."""
        if self.point is None:
            for p in self.cfg.policies:
                eval_log(self.out_dir, p.name).unlink(missing_ok=True)
            return []
        for p in self.cfg.policies:
            keep_lines_until(eval_log(self.out_dir, p.name), self.point.step)
        return keep_lines_until(self.out_dir / "metrics.jsonl", self.point.step)

    def restore(self, runtimes: list[PolicyRuntime], followers: dict[str, WeightsFollower]) -> None:
        """Every learner as it was after the resume point's step, and its engine serving those weights (as a
        new version: versions never repeat)."""
        self.runtimes = runtimes
        if self.point is None:
            return
        for rt in runtimes:
            # taken out of the resume point as it is loaded: the learner copies the weights in, so the loaded ones,
            # held for the rest of the run, were a second copy of every policy's (pair A: 765 M fp32 parameters,
            # 2.9 GiB, in a run that peaks within a few GiB of a 24 GiB host)
            rt.learner.load_state_dict(self.point.learners.pop(rt.name))
            rt.worker.total_rollouts = self.point.policies[rt.name].rollouts
            rt.loop.publish(self.point.step)
            followers[rt.name].load_newest()

    def start(self) -> dict[str, float]:
        """Training starts (or goes on): each policy's last held-out accuracy so far; the random state of the
        resume point restored."""
        self.rl_started = time.monotonic()
        last_eval = {rt.name: rt.warm_accuracy for rt in self.runtimes}
        if self.point is not None:
            last_eval.update({k: v.last_eval for k, v in self.point.policies.items()})
            self.point.restore_rng()
        return last_eval

    def rl_s(self) -> float:
        """Seconds of RL steps so far, those before the resume point included."""
        return self.rl_before + time.monotonic() - self.rl_started

    def elapsed_s(self) -> float:
        """Wall seconds of the whole run so far: this invocation's, and those of the invocations before the resume
        point (what one started later spent past its last resume point is lost with it, as its steps are)."""
        return self.elapsed_before + time.monotonic() - self.started

    def after_step(self, step: int, last_eval: dict[str, float]) -> None:
        """Write a resume point when one is due (not after the last step: the final checkpoints follow)."""
        every = self.cfg.checkpoint.resume_every
        if every and step % every == 0 and step < self.cfg.budget.steps:
            save_resume_point(
                self.out_dir, self.fingerprint, step, {rt.name: rt.learner.state_dict() for rt in self.runtimes},
                {rt.name: PolicyResume(rt.rollouts, rt.warm_accuracy, rt.warm_steps, rt.pass_rate,
                                       last_eval[rt.name]) for rt in self.runtimes}, self.rl_s(), self.elapsed_s())

    def summary_fields(self) -> dict:
        return {"resumed_after_step": self.point.step} if self.point is not None else {}


def run_embedded(cfg: ExperimentConfig, out_dir: Path, reporter: Reporter | None = None,
                 cache_dir: Path | None = None) -> dict:
    """Train every policy for ``budget.steps`` and write the run's outputs; the SEE broker
    (and a local Redis server, when one is started for the run) lives as long as the run."""
    with ExitStack() as stack:
        return _run(cfg, out_dir, reporter, cache_dir, stack)


def _run(cfg: ExperimentConfig, out_dir: Path, reporter: Reporter | None, cache_dir: Path | None,
         stack: ExitStack) -> dict:
    rep = reporter or Reporter()
    started = time.monotonic()
    # the run's own display says what loads; a progress bar's redraws would each land in it as a line
    hf_logging.disable_progress_bar()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(max(1, min(torch.get_num_threads(), os.cpu_count() or 1)))
    out_dir.mkdir(parents=True, exist_ok=True)
    resumption = _Resumption(cfg, out_dir, started)
    metrics_path = out_dir / "metrics.jsonl"
    kept = resumption.records_so_far()  # metrics.jsonl holds them until they are written again below
    cache = cache_dir or default_cache_dir()

    rep.phase(f"building task {cfg.task.name}")
    task, verifier = build_task_from_config(cfg)
    dump_config(cfg, out_dir / "config.yaml")  # resolved: building the task settles task.answer_format

    for p in cfg.policies:  # pre-flight: an absent engine server fails before any model work
        if not p.engine.facts.in_process:
            with _engine_errors(p.name):
                probe_engine(p.engine)
    rep.phase(f"opening the experience exchange ({cfg.broker.backend})")
    exchange = stack.enter_context(open_exchange(cfg))
    # server engines (vllm, sglang) read weights from disk; in-process ones share memory
    servers = any(not p.engine.facts.in_process for p in cfg.policies)
    store = WeightStore(out_dir / "weights") if servers else WeightStore()
    if resumption.point is not None:
        rep.phase(f"resuming after step {resumption.point.step} (its resume point in {out_dir})")
    runtimes = _build_runtimes(cfg, task, verifier, cache, exchange, store, rep, out_dir, resumption.point)
    dump_config(cfg, out_dir / "config.yaml")  # again: loading the models settled what their size decides (optim.lr)

    # the rollout side loads each version the learner announces (write, then announce, then load)
    followers = {rt.name: WeightsFollower(rt.name, exchange, store, rt.engine.update_weights,
                                          lambda e=rt.engine: e.info().weights_version,
                                          on_refused=_refused(rt.name)) for rt in runtimes}
    for rt in runtimes:
        rt.worker.weights_step = followers[rt.name].served_step
    resumption.restore(runtimes, followers)
    distributor = PromptDistributor(task.train, cfg.budget.prompts_per_step, seed=cfg.seed)
    group, once = new_group(), WarnOnce(rep.warn)
    # from here the run writes: a resumed one's records so far go in again first (an error before this point, a
    # model that fails to load or a disk too small, leaves metrics.jsonl as it was)
    metrics_path.write_text("")
    writer = MetricsWriter(metrics_path)
    sink = RecordSink(writer, {rt.name: open_tracker(cfg.tracking, run_info(cfg, rt.name, group, out_dir), once)
                               for rt in runtimes})
    if "tensorboard" in cfg.tracking.backends:
        rep.note(f"watch it: mutualrl watch {out_dir}  (TensorBoard on http://127.0.0.1:6006)")
    for rec in kept:  # a resumed run's records so far, to the file again and to this invocation's trackers
        sink.write(rec)
    if not kept:
        for rt in runtimes:
            sink.write({"step": 0, "policy": rt.name, "rollouts": 0, "eval_accuracy": rt.warm_accuracy,
                        "phase": "warm_start"})

    last_eval = _train(cfg, runtimes, distributor, followers, sink, rep, resumption.start(),
                       first=resumption.first_step, after_step=resumption.after_step)
    writer.close()
    rl_s = resumption.rl_s()

    return _finish(cfg, out_dir, runtimes, sink, last_eval, resumption, rl_s, rep)


def _finish(cfg: ExperimentConfig, out_dir: Path, runtimes: list[PolicyRuntime], sink: RecordSink,
            last_eval: dict[str, float], resumption: _Resumption, rl_s: float, rep: Reporter) -> dict:
    """The budget is done: each policy's final checkpoint, the curves, the trackers' last numbers and
    ``summary.json``; then the resume point has served."""
    metrics_path = out_dir / "metrics.jsonl"
    rep.phase("writing checkpoints and summary")
    for rt in runtimes:
        model, opt = rt.loop.finish()
        save_checkpoint(
            out_dir / "checkpoints" / rt.name,
            model,
            rt.artifacts.tokenizer,
            opt,
            {"step": cfg.budget.steps, "weights_version": rt.learner.version, "policy": rt.name,
             "source": rt.artifacts.source},
        )
    records = read_metrics(metrics_path)
    plot_curves(records, out_dir / "curves.png", title=f"{cfg.name} — sharing: {cfg.sharing.describe()}")
    policies = _policy_summaries(runtimes, last_eval)
    tracking = sink.finish(policies)  # after the checkpoints: a slow tracker delays nothing users need
    summary = write_summary(
        out_dir, cfg.name, cfg.sharing.describe(), cfg.budget.steps, policies,
        # wall seconds of the whole run and of its RL steps (evaluations included, warm starts,
        # model loading and the final checkpoints not): what a compare's budget is made of
        elapsed_s=round(resumption.elapsed_s(), 1), rl_s=round(rl_s, 1),
        threads=torch.get_num_threads(), tracking=tracking, **resumption.summary_fields(),
    )
    discard_resume_point(out_dir)  # the final checkpoints and the summary are written: it has served
    return summary
