"""Pydantic schema of an experiment. Every field documents its default and why.

Defaults follow docs/algorithms.md §5 where they are paper values, scaled down where
the embedded CPU default needs it (noted per field).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import ConfigDict, Field, field_validator, model_validator

from mutualrl.config.engines import engine_facts
from mutualrl.config.kubernetes import KubernetesConfig, PodConfig
from mutualrl.config.policy import (
    BUILT_LR,
    LARGE_MODEL_PARAMS,
    LARGE_PRETRAINED_LR,
    MODEL_PRESETS,
    PRETRAINED_LR,
    EngineConfig,
    ModelConfig,
    OptimConfig,
    PolicyConfig,
    PromptConfig,
    ResourcesConfig,
    TokenizerConfig,
    WarmStartConfig,
    pretrained_lr,
)
from mutualrl.config.runtime import BrokerConfig, CheckpointConfig, LauncherConfig, MwraConfig, WeightsConfig
from mutualrl.config.sharing import (
    MODE_SECTIONS,
    AsyncConfig,
    CapabilityConfig,
    EdgeConfig,
    HacpoConfig,
    PrpConfig,
    SgtConfig,
    SgtRConfig,
    SharingConfig,
    ThlConfig,
    XgrpoConfig,
    check_graph,
)
from mutualrl.config.strict import Strict as _Strict
from mutualrl.config.tracking import TrackingConfig

__all__ = [  # the one import face of the experiment's schema: every section, wherever it is defined
    "BUILT_LR", "LARGE_MODEL_PARAMS", "LARGE_PRETRAINED_LR", "MODEL_PRESETS", "MODE_SECTIONS", "PRETRAINED_FORMATS",
    "PRETRAINED_LR", "AlgorithmConfig", "AsyncConfig", "BrokerConfig", "BudgetConfig", "CapabilityConfig",
    "CheckpointConfig", "EdgeConfig", "EngineConfig", "EvalConfig", "ExperimentConfig", "HacpoConfig",
    "KubernetesConfig", "LauncherConfig", "ModelConfig", "MwraConfig", "OptimConfig", "PodConfig", "PolicyConfig",
    "PromptConfig", "PrpConfig", "ResourcesConfig", "SgtConfig", "SgtRConfig", "SharingConfig", "TaskConfig",
    "ThlConfig", "TokenizerConfig", "TrackingConfig", "WarmStartConfig", "WeightsConfig", "XgrpoConfig",
    "pretrained_lr",
]


PRETRAINED_FORMATS: dict[str, str] = {"arithmetic": "last_number", "countdown": "last_line", "jsonl": "whole"}
"""The answer format a pretrained model is asked for per task (the tasks' own ``answer_format``; a test checks they
agree); reasoning_gym has none here: its format is read from its data when the task is built."""

class TaskConfig(_Strict):
    """The verifiable task every policy is trained on and evaluated with."""
    name: Literal["arithmetic", "countdown", "jsonl", "reasoning_gym"] = "arithmetic"
    verifier: str = Field("default",
                          description="`default` (the task's own, answers extracted in answer_format), `exact`, "
                          "`math` or `countdown`.")
    path: Optional[str] = Field(None, description="JSONL file for task `jsonl`.")
    dataset: Optional[str] = Field(None, description="reasoning_gym: the dataset name (e.g. basic_arithmetic, "
                                   "countdown, spell_backward).")
    dataset_config: dict[str, Any] = Field(default_factory=dict, description="reasoning_gym: the dataset's settings "
                                           "(its config class's fields, e.g. "
                                           "basic_arithmetic {min_terms: 2, "
                                           "max_terms: 2, max_digits: 1}); the seed "
                                           "and size come from the experiment.")
    answer_format: Optional[Literal["whole", "last_number", "boxed", "answer_tags", "last_line"]] = Field(
        None, description="How a completion gives its answer: the whole completion, its last number, the last "
                          "\\boxed{}, the last <answer></answer> tags, or its last line. None: `whole` when every "
                          "policy is a built model (they learn the bare answer), else the task's own (arithmetic "
                          "last_number, countdown last_line, reasoning_gym from its data: last_number when every "
                          "sampled reference answer is a number, else answer_tags). `mutualrl probe` measures "
                          "which format each policy can follow.")
    instruction: Optional[str] = Field(
        None, description="How to answer, told to every policy whose prompts go through a chat template or the "
                          "completion form (after the task text in the user turn; a policy's own "
                          "prompt.instruction replaces it); None: the answer format's default sentence; \"\" for "
                          "none. Built models without a template see the bare prompt.")
    train_size: int = Field(20000, ge=1)
    eval_size: int = Field(256, ge=1)
    min_digits: int = Field(1, ge=1, description="arithmetic")
    max_digits: int = Field(2, ge=1, description="arithmetic")
    operators: str = Field("+", description="arithmetic: subset of '+-*'")
    num_numbers: int = Field(3, ge=2, description="countdown")
    max_number: int = Field(9, ge=1, description="countdown")

    @model_validator(mode="after")
    def _check(self) -> "TaskConfig":
        if self.name == "jsonl" and not self.path:
            raise ValueError("task jsonl needs task.path")
        if self.name == "reasoning_gym" and not self.dataset:
            raise ValueError("task reasoning_gym needs task.dataset (e.g. basic_arithmetic)")
        if self.name != "reasoning_gym" and (self.dataset or self.dataset_config):
            raise ValueError("task.dataset and task.dataset_config are for task reasoning_gym")
        if self.min_digits > self.max_digits:
            raise ValueError("task.min_digits must be <= task.max_digits")
        if self.verifier not in ("default", "exact", "math", "countdown"):
            raise ValueError(f"unknown verifier {self.verifier!r}; valid: default, exact, math, countdown")
        return self

class AlgorithmConfig(_Strict):
    """Base objective of every learner (docs/algorithms.md §1.1–§1.2, defaults from §5)."""

    loss: Literal["grpo", "gspo", "gspo_token"] = Field(
        "grpo", description="Policy loss: grpo (token PPO-clip), gspo (sequence ratio, §1.2) or gspo_token."
    )
    clip_low: Optional[float] = Field(None, ge=0, description="ε_low; None = the loss's default (grpo 0.2, gspo 3e-4).")
    clip_high: Optional[float] = Field(None, ge=0, description="ε_high; None = the loss's default (grpo 0.28 "
                                       "clip-higher, gspo 4e-4).")
    clip_ratio_c: Optional[float] = Field(3.0, gt=1, description="Dual-clip c for Â<0 (grpo loss only); null disables "
                                          "it.")
    kl_coef: float = Field(0.0, ge=0, description="β of the KL to the reference (warm-start) policy; 0 skips the "
                           "reference model.")
    kl_type: Literal["k1", "k2", "k3", "k3+"] = Field("k3", description="KL estimator (k3 = verl low_var_kl).")
    norm_adv_by_std: bool = Field(True, description="False gives Dr.GRPO's r - mean advantage.")
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = Field(
        "token-mean", description="verl loss_agg_mode (token-mean = DAPO; seq-mean-token-sum-norm = Dr.GRPO)."
    )
    loss_scale_factor: Optional[int] = Field(None, ge=1, description="Normaliser of seq-mean-token-sum-norm; None = "
                                             "budget.max_new_tokens.")
    epsilon: float = Field(1e-6, gt=0, description="Std floor in the advantage denominator.")
    minibatch_rows: Optional[int] = Field(
        None, ge=1,
        description="Rows per optimiser update; a step's rows (in order: own first, then peers') are split into "
        "ceil(rows/minibatch_rows) updates. None = one update per step. HACPO's code: 512 rows of 2048 (4 updates).",
    )
    micro_batch_rows: Optional[int] = Field(
        None, ge=1, description="Rows per forward/backward pass inside one update (gradient accumulation): the same "
        "update in less activation memory; one forward and backward per pass (a mode whose loss pools rows adds a "
        "gradient-free forward, docs/algorithms.md §7.2). None: "
        "the whole mini-batch at once (unless micro_batch_tokens splits it).")
    micro_batch_tokens: Optional[int] = Field(
        None, ge=16, description="Prompt + completion tokens per forward/backward pass (padding counted): rows are "
        "bucketed by length so a pass computes on few pad tokens. With micro_batch_rows, both bounds hold.")
    share_prompt_forward: bool = Field(
        True, description="Rows of one pass that share a prompt (a group) share its forward: the prompt runs once "
        "with a KV cache and each row's completion runs on a copy of it (docs/algorithms.md §7.2). The same "
        "log-probs and gradients to float rounding, for a fraction of the tokens; false: every row's whole sequence.")
    behaviour_correction: Literal["auto", "on", "off"] = Field(
        "auto", description="Correct for the sampler computing other numbers than the learner (bf16, another engine, "
        "pipelined sampling): the clip anchored at the learner's own log-probs, the sampler's weighting each token "
        "(truncated at async.is_cap; docs/algorithms.md §7.1). auto: on when the precision is not float32, the engine "
        "is not hf, or sampling is pipelined.")

    def clip_bounds(self) -> tuple[float, float]:
        """(ε_low, ε_high) with the loss-specific defaults filled in."""
        lo, hi = (3e-4, 4e-4) if self.loss.startswith("gspo") else (0.2, 0.28)
        return (lo if self.clip_low is None else self.clip_low, hi if self.clip_high is None else self.clip_high)


class BudgetConfig(_Strict):
    """How much RL each policy gets: steps, prompts per step, samples per prompt, response length."""
    steps: int = Field(30, ge=0, description="RL steps (optimiser updates per learner).")
    prompts_per_step: int = Field(16, ge=1, description="Prompts per step, the same for every policy.")
    group_size: int = Field(8, ge=1, description="G, completions per prompt per policy.")
    max_new_tokens: int = Field(8, ge=1, description="Maximum completion length.")


class EvalConfig(_Strict):
    """How often and on how many held-out problems greedy accuracy is measured."""
    every: int = Field(5, ge=1, description="Held-out greedy evaluation every N steps (and at the end).")
    size: int = Field(256, ge=1, description="Held-out problems per evaluation.")
    every_for: dict[str, int] = Field(default_factory=dict, description="A policy's own cadence, overriding "
                                      "`every` (e.g. a peer whose accuracy is not the question: its `steps`, so it is "
                                      "evaluated at the start and the end only).")
    pass_rate_check: bool = Field(True, description="Before RL, sample each pretrained policy once on up to "
                                  "pass_rate_problems held-out problems at its own temperature: a policy at 0 % gets "
                                  "a WARNING and summary.json says GRPO may have no signal for it, with the pass rate "
                                  "the sample cannot rule out (rate_upper95) and the answer formats under which the "
                                  "same completions would have scored.")
    pass_rate_problems: int = Field(32, ge=1, description="Problems the pass-rate check samples.")
    pass_rate_budget_s: float = Field(60.0, gt=0, description="The pass-rate check stops sampling after this long "
                                      "(per policy) and reports what it measured.")
    no_signal_steps: int = Field(3, ge=1, description="K: a WARNING when a learner's own groups had all-equal rewards "
                                 "(no GRPO signal) for K consecutive steps; the gauge mutualrl_no_signal_steps counts "
                                 "them and an alert fires on it.")


class ExperimentConfig(_Strict):
    """A whole experiment file: what `mutualrl validate`, `run`, `up` and the controller read."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)
    name: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    seed: int = Field(0, description="Seed of the RL run: prompt order, sampling, update order.")
    base_seed: Optional[int] = Field(
        None, description="Seed of what every run starts from — the task's train/eval split, the model's initial "
                          "weights and its warm start; None = `seed`. Fix it to compare seeds of RL from one starting "
                          "checkpoint, as papers fine-tune one base model.")
    output_dir: str = Field("runs", description="Runs go to <output_dir>/<name> unless --out is given.")
    policies: list[PolicyConfig] = Field(..., min_length=1)
    task: TaskConfig = Field(default_factory=TaskConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    sharing: SharingConfig = Field(default_factory=SharingConfig)
    # `async` is a Python keyword: the file says `async:`, the code `cfg.async_`
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async")
    thl: ThlConfig = Field(default_factory=ThlConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    launcher: LauncherConfig = Field(default_factory=LauncherConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    weights: WeightsConfig = Field(default_factory=WeightsConfig)
    mwra: MwraConfig = Field(default_factory=MwraConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @property
    def start_seed(self) -> int:
        """The seed of the starting point: the task split, model initialisation and warm start."""
        return self.seed if self.base_seed is None else self.base_seed

    @field_validator("policies")
    @classmethod
    def _unique_names(cls, v: list[PolicyConfig]) -> list[PolicyConfig]:
        names = [p.name for p in v]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"policy names must be unique; repeated: {', '.join(sorted(dup))}")
        return v

    @model_validator(mode="after")
    def _collective_fits(self) -> "ExperimentConfig":
        if self.weights.deltas == "on":
            if self.weights.transport == "collective":
                raise ValueError("weights.deltas on: deltas travel through the filesystem or shm transport, not "
                                 "collective (a broadcast sends every tensor whole)")
            if not any(engine_facts(p.engine.backend).weight_deltas for p in self.policies):
                raise ValueError("weights.deltas on: no policy has an hf engine or another that takes deltas (a vLLM "
                                 "or SGLang server reloads whole checkpoints)")
        if self.weights.transport != "collective":
            return self
        for p in self.policies:
            if p.resources.rollout_replicas > 1:
                raise ValueError(f"policy {p.name}: weights.transport collective serves one rollout engine per policy "
                                 f"(resources.rollout_replicas is {p.resources.rollout_replicas}); use the filesystem "
                                 "transport for replicas")
            takes = engine_facts(p.engine.backend).collective_backends
            if self.weights.backend != "auto" and self.weights.backend not in takes:
                over = " or ".join(b.upper() for b in takes)
                raise ValueError(f"policy {p.name}: a {p.engine.backend} engine takes weights over {over} only "
                                 f"(weights.backend {self.weights.backend})")
        return self

    @model_validator(mode="after")
    def _answer_format(self) -> "ExperimentConfig":
        # built models are trained on bare answers; a pretrained one answers in sentences and is told how: the
        # task's own format (reasoning-gym's is read from its data when the task is built: left None here)
        if self.task.answer_format is None:
            pretrained = any(p.model.path for p in self.policies)
            self.task.answer_format = PRETRAINED_FORMATS.get(self.task.name) if pretrained else "whole"
        return self

    def eval_every(self, policy: str) -> int:
        """How often ``policy`` is evaluated (``eval.every_for``, else ``eval.every``)."""
        return self.eval.every_for.get(policy, self.eval.every)

    @model_validator(mode="after")
    def _eval_cadences_name_policies(self) -> "ExperimentConfig":
        names = {p.name for p in self.policies}
        unknown = sorted(set(self.eval.every_for) - names)
        if unknown:
            raise ValueError(f"eval.every_for names no policy: {', '.join(unknown)} "
                             f"(policies: {', '.join(sorted(names))})")
        bad = sorted(n for n, k in self.eval.every_for.items() if k < 1)
        if bad:
            raise ValueError(f"eval.every_for: a cadence must be at least 1 step ({', '.join(bad)})")
        return self

    @model_validator(mode="after")
    def _sharing_needs_peers(self) -> "ExperimentConfig":
        if self.sharing.mode != "none" and len(self.policies) < 2:
            raise ValueError(f"sharing.mode {self.sharing.mode!r} needs at least two policies")
        names = [p.name for p in self.policies]
        if self.sharing.edges is not None:
            check_graph(self.sharing, names)
        # each mode's own settings check what they need of the rest
        for name in names:
            _, sharing = self.sharing.for_receiver(name, names)
            section = getattr(sharing, sharing.mode, None)
            if section is not None and hasattr(section, "check_experiment"):
                section.check_experiment(self)
        return self

    def check_paths(self, base: Path | None = None) -> None:
        """Existence checks that pydantic cannot do statically (raised as ValueError)."""
        for p in self.policies:
            for label, value in (("model.path", p.model.path), ("tokenizer.path", p.tokenizer.path)):
                if value and _looks_local(value) and not Path(value).exists() and value not in MODEL_PRESETS:
                    raise ValueError(f"policy {p.name!r}: {label} does not exist: {value} "
                                     "(a folder, or a model preset: `mutualrl models list`)")
        if self.task.path and not Path(self.task.path).is_file():
            raise ValueError(f"task.path does not exist: {self.task.path}")


def _looks_local(value: str) -> bool:
    """Hub names look like `org/name`; anything else with a path separator, ~ or . is a local path."""
    return value.startswith((".", "/", "~")) or value.count("/") != 1 or Path(value).exists()
