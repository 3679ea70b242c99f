"""Loading one policy (model, tokenizer, warm start) and the task from the config — shared by
the embedded run and the services, so a policy is the same object whichever launcher runs it.
The services build their own parts from a `PreparedPolicy` (`make_worker`, `make_learner`)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from mutualrl.config import ConfigError, ExperimentConfig
from mutualrl.config.schema import PolicyConfig, pretrained_lr
from mutualrl.models.families import ModelShape
from mutualrl.models.policy import PolicyArtifacts, PromptStyle, load_policy, policy_tokenizer
from mutualrl.models.precision import Precision, resolve_precision
from mutualrl.runtime.evaluation import greedy_eval
from mutualrl.runtime.warm_start import warm_start
from mutualrl.tasks import Task, Verifier, build_task, build_verifier
from mutualrl.tasks.answers import INSTRUCTIONS


@contextmanager
def input_errors(what: str) -> Iterator[None]:
    """Failures while *loading* user-named inputs (files that are missing or malformed, paths
    that are not models) are input problems: re-raise them as ConfigError, which the CLI
    prints as one line. Errors anywhere else keep their type and traceback."""
    try:
        yield
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e


def build_task_from_config(cfg: ExperimentConfig) -> tuple[Task, Verifier]:
    """The experiment's task and verifier, built from its ``task`` section."""
    t = cfg.task
    common = {"seed": cfg.start_seed, "eval_size": t.eval_size}
    with input_errors(f"task {t.name}"):
        if t.name == "arithmetic":
            task = build_task("arithmetic", train_size=t.train_size, min_digits=t.min_digits, max_digits=t.max_digits,
                              operators=t.operators, **common)
        elif t.name == "countdown":
            task = build_task("countdown", train_size=t.train_size, num_numbers=t.num_numbers, max_number=t.max_number,
                              **common)
        elif t.name == "reasoning_gym":
            task = build_task("reasoning_gym", dataset=t.dataset, settings=t.dataset_config, train_size=t.train_size,
                              **common)
        else:
            task = build_task("jsonl", path=t.path, train_size=t.train_size, **common)
        task.train  # the splits now, so a task too small to split is bad input before any model loads
        if t.answer_format is None:  # a pretrained policy: the task's own format (read from its data)
            t.answer_format = task.default_answer_format()
        return task, build_verifier(t.verifier, task, t.answer_format)


def task_instruction(cfg: ExperimentConfig, fmt: str | None = None) -> str:
    """The task-wide instruction, given to a pretrained policy without one of its own: ``task.instruction``, else
    the default of answer format ``fmt`` (None: the task's, which must be resolved by then —
    :func:`build_task_from_config` does it; `mutualrl probe` passes each format it tries)."""
    if cfg.task.instruction is not None:
        return cfg.task.instruction
    fmt = fmt if fmt is not None else cfg.task.answer_format
    if fmt is None:
        raise RuntimeError("task.answer_format is resolved when the task is built (build_task_from_config)")
    return INSTRUCTIONS[fmt]


def policy_instruction(cfg: ExperimentConfig, p: PolicyConfig, fmt: str | None = None) -> str:
    """The instruction policy ``p`` is given: its own ``prompt.instruction`` where set, else the task's
    (:func:`task_instruction`, under answer format ``fmt``)."""
    return p.prompt.instruction if p.prompt.instruction is not None else task_instruction(cfg, fmt)


def prompt_style(cfg: ExperimentConfig, p: PolicyConfig) -> PromptStyle:
    """How policy ``p`` is shown prompts (``policies[].prompt``, its tokenizer's chat_template setting) and its
    instruction (:func:`policy_instruction`). A built model is never put in completion form under ``auto``: it
    is trained on the bare task text."""
    pr = p.prompt
    chat = {"chat": True, "completion": False, "bare": False}.get(pr.style, p.tokenizer.chat_template)
    completion = pr.template if pr.style == "completion" or (pr.style == "auto" and p.model.path) else None
    return PromptStyle(chat_template=chat, instruction=policy_instruction(cfg, p), completion_template=completion,
                       stop=tuple(pr.stop) if pr.stop is not None else None)


def sampling_temperature(p: PolicyConfig) -> float:
    """The temperature a policy is sampled at when its pass rate is measured: its engine's, or 1 where the engine
    decodes greedily (a rate at temperature 0 is one sample's)."""
    return p.engine.temperature if p.engine.temperature > 0 else 1.0


def model_path(p: PolicyConfig, cache: Path | None, phase: Callable[[str], None] = lambda s: None) -> str | None:
    """``model.path`` as a folder: a preset name (``smollm2-135m-instruct``) is converted on first use."""
    if not p.model.path:
        return None
    from mutualrl.models.pretrained import ModelImportError, resolve_model_path

    try:
        return resolve_model_path(p.model.path, cache, echo=lambda s: phase(f"[{p.name}] {s}"),
                                  accept_license=p.model.accept_license)
    except ModelImportError as e:
        raise ValueError(str(e)) from e


@dataclass
class PreparedPolicy:
    """A policy ready to train: its config, artifacts and how many warm-start steps it took."""
    config: PolicyConfig
    index: int
    arts: PolicyArtifacts
    warm_steps: int
    precision: Precision = field(default_factory=lambda: resolve_precision("float32", pretrained=False, device="cpu"))


def prepare_policy(cfg: ExperimentConfig, index: int, task: Task, verifier: Verifier, cache: Path,
                   phase: Callable[[str], None] = lambda s: None,
                   warn: Callable[[str], None] | None = None) -> PreparedPolicy:
    """Load (or build) the policy and warm-start it; both are cached by content hash, so a
    second process preparing the same policy loads instead of recomputing. ``warn`` (default: ``phase``)
    gets what the user should know before a long run, such as a precision this device only emulates."""
    p = cfg.policies[index]
    start_seed = p.start_seed(cfg.start_seed, index)  # initial weights and warm start alike
    precision = resolve_precision(p.model.dtype, pretrained=bool(p.model.path), device=p.engine.device)
    phase(f"[{p.name}] loading model ({precision.name}: {precision.why})")
    if precision.warning:
        (warn or phase)(f"[{p.name}] WARNING: {precision.warning}")
    with input_errors(f"policy {p.name!r}"):
        arts = load_policy(
            path=model_path(p, cache, phase), family=p.model.family, dtype=precision.weights,
            shape=ModelShape(p.model.hidden_size, p.model.num_layers, p.model.num_heads, p.model.intermediate_size,
                             p.model.max_positions),
            tokenizer_path=p.tokenizer.path, tokenizer_kind=p.tokenizer.kind, vocab_size=p.tokenizer.vocab_size,
            corpus=task.corpus, corpus_fingerprint=task.fingerprint(), seed=start_seed, cache_dir=cache,
        )
    arts.model.to(p.engine.device)
    if p.optim.lr is None:  # a loaded model: its RL learning rate by its size (config.schema.pretrained_lr)
        p.optim.lr = pretrained_lr(arts.num_params)
        phase(f"[{p.name}] RL learning rate {p.optim.lr:g} ({arts.num_params / 1e6:.0f} M parameters; set "
              "optim.lr to choose another)")
    steps = 0
    if p.warm_start.enabled:
        w = p.warm_start
        phase(f"[{p.name}] warm start (target {w.target_accuracy:.0%}, at most {w.max_steps} steps)")
        ws = warm_start(
            arts.model, arts.tokenizer, task.train, verifier, p.warm_start,
            source=arts.source, task_fingerprint=task.fingerprint(), seed=start_seed,
            max_new_tokens=cfg.budget.max_new_tokens, cache_dir=cache, prompt_style=prompt_style(cfg, p),
            on_progress=lambda s, a, n=p.name, m=p.warm_start.max_steps: phase(
                f"[{n}] warm start step {s} of max {m}: validation {a:.1%}"),
        )
        steps = ws.steps
        if ws.cached:
            phase(f"[{p.name}] warm start from the cache: {ws.steps} steps, validation {ws.accuracy:.1%}")
        if ws.accuracy < p.warm_start.target_accuracy:
            # RL from a policy that never learned the task has no signal to amplify: say so
            # loudly instead of training for the whole budget on all-fail groups
            phase(f"[{p.name}] WARNING: warm start stopped at max_steps ({ws.steps}) with validation "
                  f"{ws.accuracy:.1%}, below its target {p.warm_start.target_accuracy:.0%}; RL will see few successes "
                  "(raise warm_start.max_steps or lr, or pin another policies[].init_seed)")
    return PreparedPolicy(p, index, arts, steps, precision)


def peer_tokenizer(cfg: ExperimentConfig, index: int, task: Task, cache: Path):
    """Policy ``index``'s tokenizer alone (cached by content hash): what a learner needs of a
    peer — never its model or warm start."""
    p = cfg.policies[index]
    with input_errors(f"policy {p.name!r}"):
        tok, _ = policy_tokenizer(model_path(p, cache), p.tokenizer.path, p.tokenizer.kind, p.tokenizer.vocab_size,
                                  task.corpus, task.fingerprint(), cache)
    return tok


def evaluate(pp: PreparedPolicy, model, task: Task, verifier: Verifier, cfg: ExperimentConfig,
             log: Path | None = None, step: int = 0) -> float:
    """A policy's held-out greedy accuracy on the first ``eval.size`` problems, prompted as in training. With
    ``log`` (a run's ``evals/<policy>.jsonl``) each problem's completion and score are appended under ``step``:
    the per-problem paired comparisons and the answer-style analysis of ``mutualrl compare`` read them."""
    problems = task.eval[: cfg.eval.size]
    res = greedy_eval(model, pp.arts.tokenizer, problems, verifier, cfg.budget.max_new_tokens,
                      prompt_style=prompt_style(cfg, pp.config))
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(json.dumps(res.record(step, problems)) + "\n")
    return res.accuracy


def eval_log(out_dir: Path, policy: str) -> Path:
    """Where a run keeps ``policy``'s per-problem evaluations."""
    return out_dir / "evals" / f"{policy}.jsonl"


def pass_rate_before_rl(pp: PreparedPolicy, task: Task, verifier: Verifier, cfg: ExperimentConfig,
                        warn: Callable[[str], None] = lambda s: None) -> dict | None:
    """A pretrained policy's sampled pass rate at its own temperature before RL (``eval.pass_rate_check``),
    as ``summary.json`` keeps it; at 0 % a WARNING through ``warn`` (docs: runtime.pass_rate). None for a built
    model (its warm start already targets a pass rate) or when the check is off."""
    from mutualrl.runtime.pass_rate import NO_SIGNAL, sampled_pass_rate

    p = pp.config
    if not cfg.eval.pass_rate_check or not p.model.path:
        return None
    fmt = cfg.task.answer_format or "whole"
    temperature = sampling_temperature(p)
    pr = sampled_pass_rate(pp.arts.model, pp.arts.tokenizer, task.eval[: cfg.eval.pass_rate_problems], verifier, fmt,
                           lambda f: build_verifier(cfg.task.verifier, task, f), prompt_style(cfg, p),
                           cfg.budget.max_new_tokens, temperature, cfg.eval.pass_rate_budget_s, seed=cfg.seed)
    out = pr.summary()
    if out.get("no_signal"):
        better = ", ".join(out["better_formats"]) or "none of the other formats either"
        warn(f"[{p.name}] WARNING: 0 of {pr.problems} sampled answers pass in answer format {fmt} (T={temperature}): "
             f"{NO_SIGNAL} (0 of {pr.problems} leaves its pass rate anywhere up to {pr.upper95 * 100:.0f} % at 95 % "
             "confidence; more eval.pass_rate_problems narrow it, and the run warns again if its groups stay "
             f"all-equal for eval.no_signal_steps). The same completions would score under: {better}. "
             "Try `mutualrl probe`.")
    return out
