"""Pydantic schema of an experiment. Every field documents its default and why.

Defaults follow docs/algorithms.md §5 where they are paper values, scaled down where
the embedded CPU default needs it (noted per field).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import ConfigDict, Field, field_validator, model_validator

from mutualrl.config.kubernetes import KubernetesConfig, PodConfig
from mutualrl.config.strict import Strict as _Strict
from mutualrl.config.tracking import TrackingConfig


class ModelConfig(_Strict):
    """The network: either a tiny built ``family`` or a Hugging Face ``path``."""

    family: Optional[Literal["llama", "qwen2", "gpt2"]] = Field(
        None, description="Build a randomly initialised model of this family.")
    path: Optional[str] = Field(None, description="Local model directory (or hub name when online) to load instead, "
                                "or a preset (`mutualrl models list`), converted on first use.")
    accept_license: bool = Field(False, description="Accept the preset's terms (Gemma's) for its conversion on first "
                                 "use; read them first (`mutualrl models get gemma-3-270m` shows where).")
    hidden_size: int = Field(128, ge=8, description="Built models only.")
    num_layers: int = Field(4, ge=1, description="Built models only.")
    num_heads: int = Field(4, ge=1, description="Built models only.")
    intermediate_size: int = Field(512, ge=8, description="Built models only (MLP width).")
    max_positions: int = Field(128, ge=16, description="Built models only: context length.")
    dtype: Literal["auto", "float32", "bf16-mixed", "bfloat16", "float16"] = Field(
        "auto", description="Precision (docs/algorithms.md §7.1). float32: everything in fp32 (tests, golden runs). "
                            "bf16-mixed: fp32 weights and optimiser state, forward and backward under bf16 autocast, "
                            "log-probs and loss in fp32. bfloat16/float16: the weights themselves in that dtype. auto: "
                            "bf16-mixed for a loaded model on a CUDA GPU with bf16 or a CPU with AVX-512 BF16/AMX, "
                            "float32 otherwise (built models; CPUs that emulate bf16, ~100x slower).")
    gradient_checkpointing: bool = Field(False, description="Recompute each layer's activations in the backward "
                                         "instead of keeping them: about a third more compute for a fraction of "
                                         "the activation memory (large models, long completions).")

    @model_validator(mode="after")
    def _one_source(self) -> "ModelConfig":
        if (self.family is None) == (self.path is None):
            raise ValueError("give exactly one of model.family or model.path")
        if self.family and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must be divisible by num_heads {self.num_heads}")
        return self


class TokenizerConfig(_Strict):
    """Either a ``kind`` trained on the task corpus or a ``path`` to an existing tokenizer."""

    kind: Optional[Literal["char", "bpe", "bpe-digits", "unigram", "wordpiece", "qwen2.5", "qwen2.5-task"]] = Field(
        None, description="Train this kind of tokenizer on the task corpus, or `qwen2.5`: the real Qwen2.5 vocabulary "
                          "(151,646 tokens), rebuilt offline; `qwen2.5-task`: Qwen2.5's tokenizer keeping only the "
                          "tokens that spell the task's characters (and the 256 byte tokens): task text is segmented "
                          "exactly as by the whole vocabulary, at a fraction of its output layer's cost.")
    path: Optional[str] = Field(None, description="Load a tokenizer from this directory; defaults to model.path when "
                                "the model is loaded.")
    vocab_size: int = Field(300, ge=16, description="Target vocabulary for bpe/unigram (char uses every character "
                            "seen).")
    chat_template: Optional[bool] = Field(None, description="Render prompts with the tokenizer's chat template; None "
                                          "= when it has one.")

    @model_validator(mode="after")
    def _not_both(self) -> "TokenizerConfig":
        if self.kind and self.path:
            raise ValueError("give tokenizer.kind or tokenizer.path, not both")
        return self


class PromptConfig(_Strict):
    """How a policy is prompted and where its answer ends (docs/algorithms.md §5.3)."""

    style: Literal["auto", "chat", "completion", "bare"] = Field(
        "auto", description="auto: the chat template when the tokenizer has one (SmolLM2, the Qwen2.5-Coder), "
                            "else the completion form for a loaded model (Gemma-3-270M, a base model) and the bare "
                            "task text for a built one; chat, completion or bare force one.")
    template: str = Field("{instruction}Question: {prompt}\nAnswer:",
                          description="The completion form: {prompt} is the task text, {instruction} the task's "
                                      "instruction as a first paragraph (empty when there is none).")
    stop: Optional[list[str]] = Field(None, description="Strings that end a completion (text cut before the first; "
                                      "the tokens kept up to the one that completes it). None: [\"\\n\\n\", "
                                      "\"\\nQuestion:\"] in completion form, none otherwise.")

    @model_validator(mode="after")
    def _template(self) -> "PromptConfig":
        if "{prompt}" not in self.template:
            raise ValueError("prompt.template needs {prompt} (where the task text goes)")
        try:
            self.template.format(prompt="", instruction="")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"prompt.template has a field other than {{prompt}} and {{instruction}}: {e}") from None
        if self.stop is not None and any(not x for x in self.stop):
            raise ValueError("prompt.stop has an empty string")
        return self


class EngineConfig(_Strict):
    """Where a policy's rollouts are generated: the in-process hf engine or a vLLM/SGLang server."""
    backend: Literal["hf", "vllm", "sglang"] = Field(
        "hf",
        description="Rollout engine: hf (transformers, in-process; the embedded default), or a vllm / sglang "
                    "server at `url`."
    )
    url: Optional[str] = Field(None, description="vllm/sglang: the server's base URL, e.g. http://10.0.0.5:8000 "
                               "(launch flags in README).")
    served_model: Optional[str] = Field(None, description="vllm: the model name the server serves (default: "
                                        "model.path).")
    device: str = Field("cpu", description="torch device for generation and training, e.g. cpu or cuda:0.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature (1.0: behaviour log-probs are the raw "
                               "policy's, §1.1).")
    top_k: int = Field(0, ge=0, description="0 disables top-k.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="1.0 disables nucleus filtering.")

    @model_validator(mode="after")
    def _url(self) -> "EngineConfig":
        if self.backend != "hf" and not self.url:
            raise ValueError(f"engine.backend {self.backend} needs engine.url (the {self.backend} server)")
        if self.backend == "hf" and self.url:
            raise ValueError("engine.url is only used with the vllm and sglang backends")
        return self


class OptimConfig(_Strict):
    """The learner's AdamW settings for one policy."""
    lr: Optional[float] = Field(None, gt=0, description="AdamW learning rate for RL. Unset: 1e-4 for a model built "
                                "here (tiny CPU models need more); for a loaded (pretrained) model it is chosen by the "
                                "model's size when it is loaded (pretrained_lr: 1e-5 up to 300 M parameters, 1e-6 "
                                "above, the papers' value for billion-scale models).")
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0, description="Max global grad norm.")
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warmup over the first RL steps (lr · step / "
                              "warmup_steps; 0 = none). On the evidence pair it did not prevent "
                              "the weak GPT-2's early dip (10 or 25 steps: 21% -> 32-33% after "
                              "120 steps vs 35% without).")
    train_input_embeddings: bool = Field(True, description="False: the input embedding table is frozen when the "
                                         "model's output head is a separate matrix (no gradient, no AdamW state: "
                                         "1.6 GB less for Qwen2.5-0.5B's 136 M-entry table, which RL on a handful of "
                                         "task tokens barely moves). Ignored, with a note, for a tied head.")


class WarmStartConfig(_Strict):
    """A supervised pass so RL starts with signal (nothing is downloaded at run time: tiny models are built and
    warm-started here)."""

    enabled: bool = True
    max_steps: int = Field(3000, ge=0, description="Upper bound on SFT steps.")
    target_accuracy: float = Field(0.2, ge=0, le=1, description="Stop once greedy accuracy on the validation slice "
                                   "reaches this.")
    check_every: int = Field(50, ge=1, description="Steps between validation checks.")
    batch_size: int = Field(64, ge=1)
    lr: float = Field(1e-3, gt=0)
    eval_size: int = Field(128, ge=1, description="Validation problems per check, held back from the end of the "
                           "training split (never the held-out eval problems).")


class ResourcesConfig(_Strict):
    """What MWRA needs to size this policy's gang (see docs/mwra.md)."""

    rollout_tp: int = Field(1, ge=1, le=64, description="Tensor-parallel size of one rollout engine replica (a TP "
                            "group never spans nodes).")
    rollout_replicas: int = Field(1, ge=1, description="Minimum rollout replicas; MWRA may add more.")
    learner_gpus: int = Field(1, ge=1, description="Minimum GPUs of the learner: its FSDP ranks (on a CPU host, this "
                              "many gloo ranks).")
    activation_checkpointing: bool = Field(False, description="A sharded learner recomputes each block's activations "
                                           "in backward (GPU memory for time).")
    max_gpus: Optional[int] = Field(None, ge=2, description="GPUs beyond which this policy gets no faster; None = no "
                                    "limit.")
    granularity: int = Field(1, ge=1, description="GPUs are added to this policy in units of this many.")
    scaling_efficiency: float = Field(1.0, gt=0, le=1, description="eta: speed on g GPUs is 1 + eta*(g-1).")
    step_gpu_seconds: Optional[float] = Field(None, gt=0, description="Seed for the cost of one step on one GPU; None "
                                              "estimates it from model size and tokens.")
    generate_fraction: Optional[float] = Field(None, ge=0, le=1, description="Seed for the share of a step spent "
                                               "generating; None estimates it.")
    engine_image: Optional[str] = Field(None, description="Kubernetes: image of the vLLM/SGLang sidecar of each "
                                        "rollout pod (None: the engine's release image).")
    engine_args: list[str] = Field(default_factory=list, description="Kubernetes: extra arguments of the engine "
                                   "server.")
    cpu: float = Field(4.0, gt=0, description="Kubernetes: CPU request per pod.")
    memory: str = Field("16Gi", description="Kubernetes: memory request per pod.")

    @model_validator(mode="after")
    def _fits(self) -> "ResourcesConfig":
        gang = self.rollout_tp * self.rollout_replicas + self.learner_gpus
        if self.max_gpus is not None and self.max_gpus < gang:
            raise ValueError(f"resources.max_gpus {self.max_gpus} is below the minimum gang of {gang} (rollout_tp x "
                             "rollout_replicas + learner_gpus)")
        return self


PRETRAINED_FORMATS: dict[str, str] = {"arithmetic": "last_number", "countdown": "last_line", "jsonl": "whole"}
"""The answer format a pretrained model is asked for per task (the tasks' own ``answer_format``; a test checks they
agree); reasoning_gym has none here: its format is read from its data when the task is built."""

BUILT_LR = 1e-4
"""RL learning rate of a model built here unless set (tiny models trained from a warm start)."""

PRETRAINED_LR = 1e-5
"""RL learning rate of a small loaded (pretrained) model unless set: on SmolLM2-135M-Instruct GRPO at 1e-5 lifted
held-out accuracy 35 % -> 69 % in 10 steps."""

LARGE_PRETRAINED_LR = 1e-6
"""RL learning rate of a loaded model over ``LARGE_MODEL_PARAMS`` unless set (the papers' value). AdamW's first
update moves every parameter by about lr whatever its gradient's scale (m̂/√v̂ = ±1; clipping the gradient norm
cannot shrink it), so the first-order change of the objective is about lr·‖g‖₁, which grows with the parameter
count. On Qwen2.5-Coder-0.5B-Instruct (630 M) one GRPO step at 1e-5 took held-out accuracy 81.2 -> 9.4 %; the same
step (same samples, same gradient) at 1e-6 took it to 93.8 % (docs/results/real/sgt-r/README.md)."""

LARGE_MODEL_PARAMS = 300_000_000
"""Parameter count from which a loaded model gets ``LARGE_PRETRAINED_LR`` (SmolLM2-135M and Gemma-3-270M stay at
``PRETRAINED_LR``)."""


def pretrained_lr(num_params: int) -> float:
    """The RL learning rate a loaded model of ``num_params`` parameters gets when its config sets none."""
    return LARGE_PRETRAINED_LR if num_params > LARGE_MODEL_PARAMS else PRETRAINED_LR


class PolicyConfig(_Strict):
    """One policy: its model, tokenizer, engine, optimiser, warm start and GPU needs."""
    name: str = Field(..., pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$",
                      description="Policy id: lower-case letters, digits, - and _.")
    model: ModelConfig
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    kubernetes: PodConfig = Field(default_factory=PodConfig, description="How its pods run on Kubernetes (static "
                                  "workloads and MWRA's gangs).")
    init_seed: Optional[int] = Field(
        None, description="Seed of this policy's initial weights and warm start (built models); default: the "
                          "experiment's base_seed (else seed) plus the policy's index. Pins a starting point when "
                          "policies are reordered or regrouped.")

    def start_seed(self, experiment_start_seed: int, index: int) -> int:
        """The seed of this policy's initial weights and warm start."""
        return self.init_seed if self.init_seed is not None else experiment_start_seed + index

    @model_validator(mode="after")
    def _pretrained_defaults(self) -> "PolicyConfig":
        # A loaded model is pretrained: the supervised warm start at lr 1e-3 that gives a built model
        # its first successes would wreck it, and RL on it wants a fine-tuning learning rate, chosen by its
        # size once it is loaded (pretrained_lr; runtime.policy_setup.prepare_policy). Only defaults change;
        # a value the file sets is kept.
        if self.model.path:
            if "enabled" not in self.warm_start.model_fields_set:
                self.warm_start.enabled = False
        elif self.optim.lr is None:
            self.optim.lr = BUILT_LR
        return self

    @model_validator(mode="after")
    def _tokenizer_source(self) -> "PolicyConfig":
        if self.model.family and not (self.tokenizer.kind or self.tokenizer.path):
            raise ValueError(f"policy {self.name!r}: a built model needs tokenizer.kind or tokenizer.path")
        if self.model.path and self.tokenizer.kind:
            raise ValueError(f"policy {self.name!r}: a loaded model uses its own tokenizer; drop tokenizer.kind")
        return self


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
        None, description="How to answer, told to every policy whose prompts go through a chat template (as its "
                          "system message); None: the answer format's default sentence; \"\" for none. Built models "
                          "without a template see the bare prompt.")
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
        "update in less activation memory, for one extra gradient-free forward pass (docs/algorithms.md §7.2). None: "
        "the whole mini-batch at once (unless micro_batch_tokens splits it).")
    micro_batch_tokens: Optional[int] = Field(
        None, ge=16, description="Prompt + completion tokens per forward/backward pass (padding counted): rows are "
        "bucketed by length so a pass computes on few pad tokens. With micro_batch_rows, both bounds hold.")
    behaviour_correction: Literal["auto", "on", "off"] = Field(
        "auto", description="Correct for the sampler computing other numbers than the learner (bf16, another engine, "
        "pipelined sampling): the clip anchored at the learner's own log-probs, the sampler's weighting each token "
        "(truncated at async.is_cap; docs/algorithms.md §7.1). auto: on when the precision is not float32, the engine "
        "is not hf, or sampling is pipelined.")

    def clip_bounds(self) -> tuple[float, float]:
        """(ε_low, ε_high) with the loss-specific defaults filled in."""
        lo, hi = (3e-4, 4e-4) if self.loss.startswith("gspo") else (0.2, 0.28)
        return (lo if self.clip_low is None else self.clip_low, hi if self.clip_high is None else self.clip_high)


class SgtConfig(_Strict):
    """Success-Gated Transfer (docs/algorithms.md §3.3)."""

    variant: Literal["nll", "group_insert"] = Field("nll",
                                                    description="nll: λ·length-normalised NLL term; group_insert: y* "
                                                    "joins the group (ratio 1).")
    weight: float = Field(0.1, ge=0, description="λ_SGT, weight of the rescue NLL term (nll variant).")
    gate_tau: float = Field(0.0, ge=0, le=1, description="Open the gate when own successes <= τ·G (τ=0: only all-fail "
                            "groups).")
    max_per_prompt: int = Field(1, ge=1, description="K_r, rescued successes kept per prompt (shortest first).")
    bank_prompts: int = Field(0, ge=0, description="Prompts kept in the learner's bank of peers' verified successes "
                              "for prompts it is not training now, released when the prompt comes up again (0: no "
                              "bank). Meant for async.peers bounded, where a peer's successes arrive at other steps.")
    bank_max_age: int = Field(32, ge=0, description="Steps a banked success stays usable.")
    guard: Literal["none", "chord", "luffy"] = Field(
        "none", description="A per-token style guard on the NLL (nll variant, docs/algorithms.md §3.3): chord weighs "
        "each rescued token by p(1-p) of the receiver's own probability, luffy by p/(p+gamma); a token the receiver "
        "finds very unlikely (a foreign answer form) then weighs ~0. none: today's plain NLL.")
    luffy_gamma: float = Field(0.1, gt=0, description="gamma of the luffy guard's p/(p+gamma).")
    select: Literal["shortest", "any"] = Field(
        "shortest", description="Which K_r successes of a prompt are kept: the shortest, or any (message order: no "
        "preference for bare answers).")


class SgtRConfig(_Strict):
    """SGT-R: a peer's verified success as a hint in the receiver's prompt; the receiver learns from the
    completions it samples itself (docs/algorithms.md §3.5, our design)."""

    hint: Literal["peer", "reference", "none"] = Field(
        "peer", description="What the rescue samples see: peer — a peer's re-verified success, its answer masked; "
        "reference — the task's own answer (no peer: a control); none — no hint text, k more plain samples of the "
        "prompts a peer solved (resample-only, a control).")
    samples: int = Field(4, ge=1, le=64, description="k, rescue samples per rescued prompt (counted in the policy's "
                         "rollouts: compare at equal rollouts).")
    max_prompts: int = Field(4, ge=1, description="Rescued prompts per step at most (the groups nearest to all-fail "
                             "first).")
    gate_tau: float = Field(0.0, ge=0, le=1, description="Rescue a prompt when own successes <= tau*G (0: all-fail "
                            "groups only).")
    show: Literal["all", "reasoning", "prefix"] = Field(
        "all", description="How much of the peer's text the hint shows: all of it (its answer masked, its form "
        "kept: what a receiver that never writes the required form needs to see), its reasoning (the text before "
        "its final answer), or its first fraction (prefix_start -> prefix_end over prefix_steps, QuestA's "
        "schedule).")
    prefix_start: float = Field(0.75, gt=0, le=1, description="The share of the peer's text shown at step 1.")
    prefix_end: float = Field(0.25, gt=0, le=1, description="The share shown after prefix_steps steps.")
    prefix_steps: int = Field(20, ge=0, description="Steps over which the shown share shrinks (0: prefix_start "
                              "throughout).")
    min_gain: Optional[float] = Field(
        None, description="The information gate: use the hint when it raises the receiver's log-probability of "
        "writing the verified answer in the required form by more than this many nats (delta = log p(answer | x + "
        "hint, the peer's work) - log p(answer | x)); otherwise the rescue is k plain samples. None (the default): "
        "every hint is used and delta is only recorded — on SmolLM2 its sign did not follow what a hint carried "
        "(docs/results/real/sgt-r/README.md).")
    max_hint_tokens: int = Field(256, ge=8, description="A peer's text longer than this (in the receiver's tokens) "
                                 "is refused as a hint (counted: too_long).")
    w_min: float = Field(0.1, ge=0, le=1, description="Floor of a rescued token's weight toward the hint-free policy "
                         "(0 is Guide's correction, which removes exactly the form a cold receiver must learn).")
    w_max: float = Field(2.0, ge=1, description="Cap of a rescued token's weight.")

    def check_experiment(self, cfg: "ExperimentConfig") -> None:
        """The rescue round runs the learner's forward passes on one rank: a sharded receiver is refused."""
        names = [p.name for p in cfg.policies]
        for p in cfg.policies:
            if p.resources.learner_gpus > 1 and cfg.sharing.for_receiver(p.name, names)[1].mode == "sgt_r":
                raise ValueError(f"sharing.mode sgt_r: policy {p.name!r} has a sharded learner "
                                 f"(resources.learner_gpus {p.resources.learner_gpus}); SGT-R's rescue round runs "
                                 "on one learner rank and does not support sharded receivers yet")


class PrpConfig(_Strict):
    """Peer Rollout Pooling (docs/algorithms.md §3.3)."""

    ratio_level: Literal["sequence", "token"] = Field("sequence",
                                                      description="Density ratio per sequence (exp(ℓ̄_n − ℓ̄_m), "
                                                      "robust to THL) or per token.")
    truncation: float = Field(1.0, gt=0, description="C of min(w, C): 1 HACPO-style, 2 TIS.")
    weight: float = Field(1.0, ge=0, description="λ_PRP, weight of the peer-row loss.")


class XgrpoConfig(_Strict):
    """Cross-policy advantage sharing (docs/algorithms.md §3.3)."""

    variant: Literal["pooled", "calibrated", "leave_self_out"] = Field("pooled",
        description="How peer AdvantageStats enter the baseline.")
    peer_weight: float = Field(1.0, ge=0, description="λ, weight of each peer sample in the pooled baseline and scale.")


class CapabilityConfig(_Strict):
    """Capability tracker (docs/algorithms.md §2.2), used by hacpo and xgrpo's calibrated variant."""

    window: int = Field(5, ge=1, description="K, batches in the moving average (the current one included).")
    metric: Literal["positive_rate", "reward_mean"] = Field("positive_rate",
                                                            description="Per-batch capability measure.")
    minimum: float = Field(1e-8, gt=0, description="Floor on P̂.")
    ratio_min: float = Field(0.1, gt=0, le=1, description="Lower clip of capability ratios.")
    ratio_max: float = Field(10.0, ge=1, description="Upper clip of capability ratios.")
    warmup_steps: int = Field(0, ge=0, description="Ratios are 1.0 while steps <= warmup_steps.")


class HacpoConfig(_Strict):
    """HACPO (docs/algorithms.md §2.7; defaults from §2.8)."""

    alpha: float = Field(1.0, ge=0, description="Exponent of the exponential IS s·sg[s]^α on cross rows.")
    delta: float = Field(0.2, ge=0, le=1, description="Stepwise clipping: cross lower bound 1 − δ at mini-batch 0.")
    delta_step: float = Field(0.025, ge=0, description="Stepwise clipping: lower bound grows by δ_step per mini-batch.")
    self_clip_low: float = Field(3e-4, ge=0, description="GSPO ε_l on self rows.")
    self_clip_high: float = Field(4e-4, ge=0, description="GSPO ε_h on self rows.")
    max_abs_log_ratio: float = Field(10.0, gt=0, description="Clamp of the sequence log-ratio before exp.")
    binary_baseline_guard: bool = Field(True, description="Weighted baseline > 1 falls back to the learner's own mean "
                                        "(§2.3).")
    schedule: Literal["paper", "rows"] = Field(
        "paper",
        description="paper: own rows in self_minibatches equal parts, then each source's rows in "
                    "cross_minibatches parts (one source per mini-batch, as the authors run it); rows: "
                    "consecutive algorithm.minibatch_rows, which must not straddle own and peer rows.")
    self_minibatches: int = Field(2, ge=1, description="paper schedule: updates on own rows per step.")
    cross_minibatches: int = Field(2, ge=1, description="paper schedule: updates on each source's rows per step.")
    scale_lr: bool = Field(
        True, description="paper schedule: divide each policy's optim.lr by the updates a step takes (self + cross "
                          "per peer), so a HACPO step moves the weights about as far as one GRPO update. At the "
                          "unscaled lr the 4 updates per step collapsed the weaker policy of the evidence suite (21% "
                          "-> 13% held-out in 60 steps); scaled it held and gained (21% -> 24%).")

    def check_experiment(self, cfg: "ExperimentConfig") -> None:
        """What HACPO needs of the rest of the experiment (checked when the mode is selected)."""
        if self.schedule == "rows":
            own = cfg.budget.prompts_per_step * cfg.budget.group_size
            mb = cfg.algorithm.minibatch_rows
            if mb is None or own % mb or mb % cfg.budget.group_size:
                raise ValueError(f"sharing.hacpo.schedule rows: algorithm.minibatch_rows ({mb}) must divide the {own} "
                                 f"own rows per step and be a multiple of group_size ({cfg.budget.group_size}), or "
                                 "mini-batches would mix own and peer rows (use sharing.hacpo.schedule: paper)")
        # HACPO's cross-agent ratio uses the peer's log-probs as π_old of the source model; a
        # sampler at another temperature or with top-k/top-p reports log-probs of a different
        # distribution, so HACPO would weigh peer rows by the wrong ratio
        for p in cfg.policies:
            e = p.engine
            if e.temperature != 1.0 or e.top_k or e.top_p < 1.0:
                raise ValueError(f"sharing.mode hacpo: policy {p.name!r} samples with temperature {e.temperature}, "
                                 f"top_k {e.top_k}, top_p {e.top_p}; its log-probs are not the model's (HACPO needs "
                                 "temperature 1 without top-k/top-p)")


ModeName = Literal["none", "naive", "prp", "xgrpo", "sgt", "sgt_r", "hacpo"]
"""The sharing modes (their classes: services/learner/modes; a test checks this literal against the registry)."""

MODE_SECTIONS = ("sgt", "sgt_r", "prp", "xgrpo", "hacpo")
"""The modes that have a settings section of their own."""


class EdgeConfig(_Strict):
    """One directed edge of the sharing graph: ``to``'s learner uses ``from``'s experience under ``mode``,
    with that mode's settings (unset: ``sharing.mode`` and the ``sharing.<mode>`` section)."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)
    source: str = Field(..., alias="from", description="The policy whose experience travels.")
    to: str = Field(..., description="The policy whose learner uses it.")
    mode: Optional[ModeName] = Field(None, description="The mode on this edge (unset: sharing.mode).")
    sgt: Optional[SgtConfig] = None
    sgt_r: Optional[SgtRConfig] = None
    prp: Optional[PrpConfig] = None
    xgrpo: Optional[XgrpoConfig] = None
    hacpo: Optional[HacpoConfig] = None

    @model_validator(mode="after")
    def _settings_of_its_mode(self) -> "EdgeConfig":
        given = [m for m in MODE_SECTIONS if getattr(self, m) is not None]
        if self.mode is not None and any(m != self.mode for m in given):
            raise ValueError(f"edge {self.source} -> {self.to}: mode {self.mode} takes no "
                             f"{', '.join(m for m in given if m != self.mode)} settings")
        if self.mode == "none":
            raise ValueError(f"edge {self.source} -> {self.to}: an edge with mode none shares nothing; leave it out")
        return self


class SharingConfig(_Strict):
    """Which experience the policies exchange (docs/algorithms.md §3.3) and each mode's settings."""
    mode: ModeName = Field(
        "none", description="How learners use peer experience: none | naive | prp | xgrpo | sgt | sgt_r | hacpo. Every "
                            "policy learns from every other under it, unless `edges` says who learns from whom."
    )
    sgt: SgtConfig = Field(default_factory=SgtConfig)
    sgt_r: SgtRConfig = Field(default_factory=SgtRConfig)
    prp: PrpConfig = Field(default_factory=PrpConfig)
    xgrpo: XgrpoConfig = Field(default_factory=XgrpoConfig)
    hacpo: HacpoConfig = Field(default_factory=HacpoConfig)
    capability: CapabilityConfig = Field(default_factory=CapabilityConfig)
    max_version_lag: int = Field(1, ge=0, description="Δ_max: ignore peer experience older than this many steps.")
    edges: Optional[list[EdgeConfig]] = Field(
        None, description="The sharing graph: who learns from whom, under which mode (unset: every policy from "
                          "every other under `mode`). A learner combines its incoming edges under one mode.")

    def edge_mode(self, edge: EdgeConfig) -> str:
        """The mode on ``edge`` (its own, else ``mode``)."""
        return edge.mode or self.mode

    def for_receiver(self, receiver: str, policies: list[str]) -> tuple[list[str], "SharingConfig"]:
        """The peers ``receiver``'s learner reads, and the sharing settings it runs under: without edges every
        other policy and this config; with edges the sources of its incoming edges, under their mode and
        settings (a policy with none learns alone, mode none)."""
        if self.edges is None:
            return [p for p in policies if p != receiver], self
        incoming = [e for e in self.edges if e.to == receiver]
        if not incoming:
            return [], self.model_copy(update={"mode": "none", "edges": None})
        mode = self.edge_mode(incoming[0])
        update: dict = {"mode": mode, "edges": None}
        sections = [getattr(e, mode, None) for e in incoming if getattr(e, mode, None) is not None]
        if sections:  # the edges that set them agree (checked with the experiment)
            update[mode] = sections[0]
        return [e.source for e in incoming], self.model_copy(update=update)

    def describe(self) -> str:
        """The sharing as a short label: the mode, or the graph's edges."""
        if self.edges is None:
            return self.mode
        return "graph: " + ", ".join(f"{e.source}->{e.to} {self.edge_mode(e)}" for e in self.edges)

    def modes_used(self, policies: list[str]) -> set[str]:
        """Every mode some learner runs under."""
        return {self.for_receiver(p, policies)[1].mode for p in policies}


class AsyncConfig(_Strict):
    """Asynchronous training (docs/algorithms.md §6): how far sampling may run ahead of training, and
    whether learners wait for their peers."""
    max_staleness: int = Field(0, ge=0, le=64, description="k: step t may be sampled with any weights version "
                               ">= t-1-k, so generation overlaps training (0 = strictly alternating).")
    peers: Literal["lockstep", "bounded"] = Field(
        "lockstep", description="lockstep: a learner waits (up to launcher.peer_deadline_s) for its peers to sample "
                                "the step; bounded: it never waits and uses the peer experience within "
                                "sharing.max_version_lag of its own step.")
    is_cap: float = Field(2.0, gt=1.0, description="Truncation of the decoupled objective's behaviour weight "
                                                   "pi_prox/pi_behaviour (used when max_staleness > 0 or "
                                                   "algorithm.behaviour_correction is on).")

    @property
    def pipelined(self) -> bool:
        """Whether rollouts may be sampled with weights older than the previous step's."""
        return self.max_staleness > 0


class ThlConfig(_Strict):
    """How peer text is retokenised and when a converted message is rejected (docs/algorithms.md §3.2)."""
    max_unaligned: float = Field(0.02, ge=0, le=1, description="Reject converted messages whose unaligned-byte "
                                 "fraction exceeds this.")
    require_roundtrip: bool = Field(True, description="Reject messages whose text does not survive the receiver's "
                                    "encode/decode.")
    placement: Literal["spread", "last"] = Field("spread",
                                                 description="Where a group's transported log-prob goes: spread over "
                                                 "its tokens or on the last.")


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
                                  "a WARNING and summary.json says GRPO has no signal for it, with the answer formats "
                                  "under which the same completions would have scored.")
    pass_rate_problems: int = Field(32, ge=1, description="Problems the pass-rate check samples.")
    pass_rate_budget_s: float = Field(60.0, gt=0, description="The pass-rate check stops sampling after this long "
                                      "(per policy) and reports what it measured.")
    no_signal_steps: int = Field(3, ge=1, description="K: a WARNING when a learner's own groups had all-equal rewards "
                                 "(no GRPO signal) for K consecutive steps; the gauge mutualrl_no_signal_steps counts "
                                 "them and an alert fires on it.")


class BrokerConfig(_Strict):
    """SEE transport (README "Experience exchange" lists the stream and group names)."""

    backend: Literal["inprocess", "redis"] = Field("inprocess",
                                                   description="inprocess (embedded default) or redis (Redis Streams).")
    url: Optional[str] = Field(None, description="redis:// or rediss:// URL; None with backend redis starts a local "
                               "server for the run.")
    username: Optional[str] = Field(None, description="Redis ACL user.")
    password_env: Optional[str] = Field(None, description="Environment variable holding the Redis password (never put "
                                        "it in the file).")
    tls: bool = Field(False, description="TLS to Redis (implied by rediss://).")
    tls_ca_certs: Optional[str] = Field(None, description="CA bundle for TLS.")
    tls_certfile: Optional[str] = Field(None, description="Client certificate for mutual TLS.")
    tls_keyfile: Optional[str] = Field(None, description="Client key for mutual TLS.")
    hmac_key_env: Optional[str] = Field(None, description="Name of an environment variable holding the run key every "
                                        "service's signing key derives from (a service given its "
                                        "own keys in MUTUALRL_SEE_KEYS uses those instead).")
    max_len: int = Field(100_000, ge=1, description="Retention bound per stream (entries).")
    max_age_s: Optional[float] = Field(None, gt=0, description="Retention bound per stream (age); None keeps entries "
                                       "until max_len.")
    max_backlog: Optional[int] = Field(None, ge=1, description="Backpressure: entries a stream may hold unfinished by "
                                       "its slowest receiver; None = unbounded.")
    on_backlog: Literal["block", "drop"] = Field("block",
                                                 description="At max_backlog: wait for receivers (block) or skip and "
                                                 "count (drop).")
    block_timeout_s: float = Field(60.0, gt=0, description="How long a blocked publisher waits before failing.")

    @model_validator(mode="after")
    def _check(self) -> "BrokerConfig":
        if self.url and self.backend != "redis":
            raise ValueError("broker.url is only used with broker.backend: redis")
        if self.url and not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"broker.url must start with redis://, rediss:// or unix://; got {self.url!r}")
        if self.max_backlog is not None and self.max_backlog > self.max_len:
            raise ValueError("broker.max_backlog must not exceed broker.max_len (trimming would drop unread entries)")
        return self


class CheckpointConfig(_Strict):
    """How often a learner service makes its state durable (`mutualrl up`, the chart, compose)."""

    every: int = Field(1, ge=1, description="Checkpoint every K steps; the messages those steps used are acknowledged "
                       "at the checkpoint, and a crash redoes the steps since the last one (a 7B "
                       "learner need not write its state every step).")


class WeightsConfig(_Strict):
    """How a learner's new weights reach its rollout engine (docs/architecture.md, "Weight transport")."""

    transport: Literal["filesystem", "collective", "shm"] = Field(
        "filesystem",
        description="filesystem: a safetensors checkpoint per version in a shared directory; collective: "
                    "broadcast from the learner into the engine's workers over a process group of their own (NCCL "
                    "on GPUs, gloo on CPU), nothing written to disk; shm: a learner and its hf engine on one host "
                    "exchange each version through two slots in shared memory (`mutualrl up` picks it when this is "
                    "left unset; compose shares the learner's IPC namespace with its rollout service). `mutualrl "
                    "run` keeps both ends in one process and passes weights in memory either way.")
    shm_dir: str = Field("/dev/shm", description="shm: where the slots live (a memory-backed filesystem).")
    backend: Literal["auto", "gloo", "nccl"] = Field("auto",
                                                     description="collective: the group's backend; auto = nccl when "
                                                     "the engine runs on a GPU (vllm/sglang, or hf on "
                                                     "cuda), gloo otherwise. A vLLM server always takes "
                                                     "NCCL.")
    port: int = Field(29600, ge=1024, le=65535, description="collective, outside `mutualrl up` (compose, Helm): the "
                      "learner hosts the group's rendezvous on this port; `up` "
                      "picks a free port per policy.")
    timeout_s: float = Field(600.0, gt=0, description="collective: how long the two ends wait for each other "
                             "(rendezvous and each version).")
    deltas: Literal["auto", "on", "off"] = Field(
        "auto",
        description="filesystem and shm, hf engines: send a version as the values that changed since the one before "
                    "it, in the dtype the engine samples in, compressed, and rebuilt bit for bit on the engine "
                    "(docs/algorithms.md §7.3). auto: on when the engine samples in bf16 or fp16 (most fp32 values "
                    "change every step, so deltas would not pay); on: always (a version whose delta is over "
                    "delta_max_share goes whole); off: every version whole. The learner keeps one copy of the "
                    "weights in the engine's dtype as the next delta's base.")
    delta_max_share: float = Field(0.5, gt=0, le=1, description="A delta larger than this share of the whole "
                                   "version's bytes is not sent: the version goes whole.")
    share_in_process: bool = Field(True, description="`mutualrl run` with synchronous sampling (async.max_staleness "
                                   "0) and an hf engine: the engine samples the learner's own module, no copy of the "
                                   "weights (the same numbers: it samples step t's rollouts after step t-1's update "
                                   "and before step t's). false keeps a copy per engine and per version in memory.")


class LauncherConfig(_Strict):
    """How `mutualrl up` runs the services (`mutualrl run` ignores all but `kind`)."""

    kind: Literal["embedded"] = Field("embedded", description="`mutualrl run`: every worker in one process.")
    rollout_deadline_s: float = Field(60.0, gt=0, description="A learner waits this long for its own step's rollouts, "
                                      "then trains on what arrived (or skips).")
    peer_deadline_s: float = Field(10.0, ge=0, description="A learner waits this long for peers to finish the step, "
                                   "then trains without them (never deadlocks).")
    max_restarts: int = Field(3, ge=0, description="Restarts per service after a crash before `up` gives up.")
    host: str = Field("127.0.0.1", description="Interface the services bind (loopback by default).")
    grpc_tls_cert: Optional[str] = Field(None, description="PEM certificate (chain) of the rollout gRPC port; with "
                                         "grpc_tls_key it serves TLS only.")
    grpc_tls_key: Optional[str] = Field(None, description="PEM private key of grpc_tls_cert.")

    @model_validator(mode="after")
    def _tls_pair(self) -> "LauncherConfig":
        if bool(self.grpc_tls_cert) != bool(self.grpc_tls_key):
            raise ValueError("launcher.grpc_tls_cert and launcher.grpc_tls_key go together")
        return self


class MwraConfig(_Strict):
    """Multi-Worker Resource Allocation: how many GPUs each policy and role gets."""

    backend: Literal["local", "kubernetes"] = Field("local",
                                                    description="local: `mutualrl up` on this host; kubernetes: "
                                                    "`mutualrl controller` creates the gangs.")
    gpus: Optional[int] = Field(None, ge=1, description="GPUs to plan; None = the GPUs torch sees on this host "
                                "(local) or the cluster's allocatable (kubernetes).")
    node_gpus: int = Field(8, ge=1, description="GPUs per node when gpus is given (the local host is one node).")
    min_gain: float = Field(0.10, ge=0, lt=1, description="Re-plan only when the predicted step is more than this "
                            "much faster...")
    move_cost_s: float = Field(120.0, ge=0, description="...and the seconds saved over the remaining steps exceed "
                               "this cost of moving.")
    ema_alpha: float = Field(0.2, gt=0, le=1, description="Weight of the newest measured step in the cost average.")
    gpu_flops: float = Field(400e12, gt=0, description="Peak bf16 FLOP/s of one GPU, for seeding step costs before "
                             "any are measured.")
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)


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
            if not any(p.engine.backend == "hf" for p in self.policies):
                raise ValueError("weights.deltas on: no policy has an hf engine (a vLLM or SGLang server reloads "
                                 "whole checkpoints)")
        if self.weights.transport != "collective":
            return self
        for p in self.policies:
            if p.resources.rollout_replicas > 1:
                raise ValueError(f"policy {p.name}: weights.transport collective serves one rollout engine per policy "
                                 f"(resources.rollout_replicas is {p.resources.rollout_replicas}); use the filesystem "
                                 "transport for replicas")
            if p.engine.backend == "vllm" and self.weights.backend == "gloo":
                raise ValueError(f"policy {p.name}: a vLLM server takes weights over NCCL only (weights.backend gloo)")
        return self

    @model_validator(mode="after")
    def _answer_format(self) -> "ExperimentConfig":
        # built models are trained on bare answers; a pretrained one answers in sentences and is told how: the
        # task's own format (reasoning-gym's is read from its data when the task is built: left None here)
        if self.task.answer_format is None:
            pretrained = any(p.model.path for p in self.policies)
            self.task.answer_format = PRETRAINED_FORMATS.get(self.task.name) if pretrained else "whole"
        return self

    def task_instruction(self) -> str:
        """The instruction a pretrained policy is given (task.instruction, else the format's default). The answer
        format must be resolved by then (``runtime.policy_setup.build_task_from_config`` does it)."""
        if self.task.instruction is not None:
            return self.task.instruction
        if self.task.answer_format is None:
            raise RuntimeError("task.answer_format is resolved when the task is built (build_task_from_config)")
        from mutualrl.tasks.answers import INSTRUCTIONS

        return INSTRUCTIONS[self.task.answer_format]

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
            _check_graph(self.sharing, names)
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
                if value and _looks_local(value) and not Path(value).exists() and not _is_model_preset(value):
                    raise ValueError(f"policy {p.name!r}: {label} does not exist: {value} "
                                     "(a folder, or a model preset: `mutualrl models list`)")
        if self.task.path and not Path(self.task.path).is_file():
            raise ValueError(f"task.path does not exist: {self.task.path}")


def _check_graph(sharing: SharingConfig, names: list[str]) -> None:
    """Edges between known policies, each once, none to itself; a learner's incoming edges under one mode with
    one set of settings (it combines them under one objective)."""
    seen: set[tuple[str, str]] = set()
    for e in sharing.edges or []:
        for end in (e.source, e.to):
            if end not in names:
                raise ValueError(f"sharing.edges: {e.source} -> {e.to} names no policy {end!r} (policies: "
                                 f"{', '.join(names)})")
        if e.source == e.to:
            raise ValueError(f"sharing.edges: {e.source} -> {e.to} is a loop; a policy's own rollouts are always used")
        if (e.source, e.to) in seen:
            raise ValueError(f"sharing.edges: {e.source} -> {e.to} is listed twice")
        seen.add((e.source, e.to))
        if sharing.edge_mode(e) == "none":
            raise ValueError(f"sharing.edges: {e.source} -> {e.to} has no mode (set it, or sharing.mode)")
    for receiver in names:
        incoming = [e for e in sharing.edges or [] if e.to == receiver]
        modes = {sharing.edge_mode(e) for e in incoming}
        if len(modes) > 1:
            raise ValueError(f"sharing.edges: {receiver}'s learner has incoming edges under "
                             f"{', '.join(sorted(modes))}; a learner combines its peers under one mode")
        sections = {repr(getattr(e, sharing.edge_mode(e), None)) for e in incoming
                    if getattr(e, sharing.edge_mode(e), None) is not None}
        if len(sections) > 1:
            raise ValueError(f"sharing.edges: {receiver}'s incoming edges set different {next(iter(modes))} "
                             "settings; a learner runs one set (put them on one edge, or in sharing."
                             f"{next(iter(modes))})")


def _is_model_preset(value: str) -> bool:
    from mutualrl.models.pretrained import is_preset  # only on this error path: it imports torch

    return is_preset(value)


def _looks_local(value: str) -> bool:
    """Hub names look like `org/name`; anything else with a path separator, ~ or . is a local path."""
    return value.startswith((".", "/", "~")) or value.count("/") != 1 or Path(value).exists()
