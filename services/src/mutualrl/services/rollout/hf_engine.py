"""The `hf` engine: transformers models sampled in-process (CPU default, GPU when present)."""

from __future__ import annotations

import contextlib
import copy
import threading
from typing import Callable, Literal

import torch
import transformers
from transformers import PreTrainedModel
from typing_extensions import override

from mutualrl.config.engines import ENGINES
from mutualrl.models.generation import Sample, sample, stop_string_check, text_decoder
from mutualrl.models.precision import Precision, resolve_precision
from mutualrl.services.rollout.engine import EngineInfo, EngineSetup, RolloutEngine, SamplingSpec
from mutualrl.weights import TensorManifest, WeightReceiver
from mutualrl.weights.deltas import is_delta
from mutualrl.weights.shared import SHARED_SCHEME


class HFEngine(RolloutEngine):
    """Owns its own copy of the model, so the learner's in-flight updates never leak into sampling.

    Log-probs are ``log_softmax`` after temperature and top-k/p ("processed",
    docs/engines.md §1), which equals the raw policy at T=1 without filters.
    """

    facts = ENGINES["hf"]

    @classmethod
    @override
    def from_config(cls, cfg, setup: EngineSetup) -> HFEngine:
        tok = setup.tokenizer
        return cls(setup.model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, store=setup.store,
                   device=cfg.device, name=setup.name, share=setup.share, precision=setup.precision,
                   adopt=setup.adopt, decode=text_decoder(tok))

    def __init__(self, model: PreTrainedModel, *, eos_id: int, pad_id: int, store: WeightReceiver, device: str = "cpu",
                 name: str = "", share: bool = False, precision: Precision | None = None, adopt: bool = False,
                 decode: Callable[[list[int]], str] | None = None):
        # decode: the tokenizer's, for ending completions at the spec's stop strings (none without it)
        # share: sample the learner's own module (`mutualrl run`, synchronous: mutualrl.weights.shared)
        self.shared = share
        self.precision = precision or resolve_precision("float32", pretrained=False, device=device)
        # bf16-mixed samples in bf16 (docs/algorithms.md §7.1): the learner's fp32 module under autocast when
        # shared, else a private copy held in bf16 (half its memory; versions are cast as they load)
        sampling_dtype = self.precision.autocast or self.precision.weights
        # adopt: the caller hands the module over (a rollout service loads it for the engine alone): no copy
        own = model if adopt else copy.deepcopy(model)
        self.model = model if share else own.to(device=device, dtype=sampling_dtype).eval()
        self.eos_id, self.pad_id = eos_id, pad_id
        self.decode = decode
        self.store = store
        self.device = device
        self.name = name or getattr(model.config, "_name_or_path", "") or model.config.model_type
        self.version = 0
        self._lock = threading.RLock()  # generate and update never interleave

    @override
    def generate(self, prompts: list[list[int]], spec: SamplingSpec,
                 cancel: threading.Event | None = None) -> list[list[Sample]]:
        if spec.n < 1:
            raise ValueError("n must be >= 1")
        flat = [p for p in prompts for _ in range(spec.n)]
        gen = None
        if spec.seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(spec.seed)
        with self._lock, (self.precision.context(self.device) if self.shared else contextlib.nullcontext()):
            out = sample(
                self.model,
                flat,
                eos_id=self.eos_id,
                pad_id=self.pad_id,
                max_new_tokens=spec.max_new_tokens,
                temperature=spec.temperature,
                top_k=spec.top_k,
                top_p=spec.top_p,
                generator=gen,
                should_stop=cancel.is_set if cancel is not None else None,
                stop=stop_string_check(self.decode, spec.stop) if self.decode is not None else None,
            )
        return [out[i * spec.n : (i + 1) * spec.n] for i in range(len(prompts))]

    @override
    def update_weights(self, version: int, uri: str, checksum: str | None = None,
                       manifest: TensorManifest | None = None) -> None:
        if version <= self.version:
            raise ValueError(f"weights version {version} is not newer than the served {self.version}")
        if uri.startswith(SHARED_SCHEME) or self.shared:
            if not (self.shared and uri.startswith(SHARED_SCHEME)):
                raise ValueError(f"weights at {uri} cannot be served by this engine (it "
                                 f"{'shares' if self.shared else 'does not share'} the learner's module)")
            with self._lock:  # the learner's module is these weights already
                self.version = version
            return
        # shared memory: each tensor copied from the learner's slot into the parameter it replaces, no whole copy of
        # the version in between (mutualrl.weights.shm). The receiver returns the version it copied: a newer one when
        # the learner rewrote the slot meanwhile
        copy_into = getattr(self.store, "copy_into", None)
        if copy_into is not None and manifest is not None and not is_delta(manifest):
            with self._lock:
                self.version = copy_into(uri, checksum, manifest, self.model.state_dict())
            return
        load_into = getattr(self.store, "load_into", None)  # a StreamingReceiver: one tensor at a time
        if load_into is not None and manifest is None:
            with self._lock:
                load_into(uri, checksum, self.model.state_dict())
                self.version = version
            return
        state = self.store.get(uri, checksum, manifest)
        with self._lock:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            real_missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied to embeddings
            if real_missing or unexpected:
                raise ValueError(f"weights at {uri} do not fit the model: missing {real_missing[:3]}, unexpected "
                                 f"{unexpected[:3]}")
            self.version = version

    @override
    def health(self) -> Literal["ok", "starting", "down"]:
        return "ok"

    @override
    def info(self) -> EngineInfo:
        return EngineInfo(
            engine=self.facts.name,
            engine_version=transformers.__version__,
            model=self.name,
            weights_version=self.version,
            logprob_mode="processed",
            capabilities={"update_from_uri": True, "seeded_sampling": True},
        )
