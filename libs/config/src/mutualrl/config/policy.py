"""One policy's settings: its model, tokenizer, prompt style, engine, optimiser, warm start and GPU needs."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from mutualrl.config.engines import EngineFacts, engine_facts, server_engines
from mutualrl.config.kubernetes import PodConfig
from mutualrl.config.strict import Strict as _Strict


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
                          description="The completion form: {prompt} is the task text, {instruction} the policy's "
                                      "instruction as a first paragraph (empty when there is none).")
    instruction: Optional[str] = Field(
        None, description="This policy's own instruction, in place of task.instruction (None: the task's; \"\" for "
                          "none). Families answer differently: a peer can be asked to show its work while a receiver "
                          "keeps the sentence it answers best under. The answer format stays the task's: every "
                          "policy's completions are read and re-verified the same way.")
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

    @property
    def facts(self) -> EngineFacts:
        """What this engine is (mutualrl.config.engines): in-process or a server, how it takes weights."""
        return engine_facts(self.backend)

    @model_validator(mode="after")
    def _url(self) -> "EngineConfig":
        in_process = engine_facts(self.backend).in_process
        if not in_process and not self.url:
            raise ValueError(f"engine.backend {self.backend} needs engine.url (the {self.backend} server)")
        if in_process and self.url:
            raise ValueError(f"engine.url is only used with the server engines ({', '.join(server_engines())}), "
                             f"not {self.backend}")
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
    state_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="AdamW's two moments per trained parameter: float32 (torch's fused AdamW, 8 bytes) or "
        "bfloat16 with stochastic rounding (4 bytes: 2 GB less for the 0.5B Qwen; the weights stay fp32; "
        "docs/algorithms.md §7.4). Not for a sharded learner (resources.learner_gpus > 1).")


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


MODEL_PRESETS = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct", "gemma-3-270m")
"""The model presets `model.path` may name instead of a folder (`mutualrl models list`; the catalogue, with each
preset's packages and hashes, is ``mutualrl.models.pretrained``: a test checks the two agree)."""

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

    @model_validator(mode="after")
    def _optimiser_state(self) -> "PolicyConfig":
        if self.optim.state_dtype == "bfloat16" and self.resources.learner_gpus > 1:
            raise ValueError(f"policy {self.name!r}: optim.state_dtype bfloat16 updates whole tensors on one rank; a "
                             f"sharded learner (resources.learner_gpus {self.resources.learner_gpus}) needs float32")
        if self.optim.state_dtype == "bfloat16" and self.model.dtype in ("bfloat16", "float16"):
            raise ValueError(f"policy {self.name!r}: optim.state_dtype bfloat16 keeps fp32 master weights; "
                             f"model.dtype {self.model.dtype} has none (use bf16-mixed or float32)")
        return self
