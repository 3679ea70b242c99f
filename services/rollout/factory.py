"""Build the rollout engine a policy's config names."""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mutualrl.config.schema import EngineConfig
from mutualrl.services.rollout.engine import RolloutEngine
from mutualrl.services.rollout.hf_engine import HFEngine
from mutualrl.services.rollout.http_engines import SGLangServerEngine, VLLMServerEngine
from mutualrl.weights import WeightStore


def build_engine(cfg: EngineConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, store: WeightStore, name: str) -> RolloutEngine:
    """``hf`` samples a private copy of ``model``; ``vllm``/``sglang`` probe their server and
    raise :class:`~mutualrl.services.rollout.http_engines.EngineUnavailable` naming what is missing."""
    if cfg.backend == "hf":
        return HFEngine(model, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, store=store, device=cfg.device, name=name)
    assert cfg.url is not None
    if store.root is None:
        raise ValueError(f"the {cfg.backend} engine loads weights from a directory; the run needs a directory weight store")
    if cfg.backend == "vllm":
        return VLLMServerEngine(cfg.url, cfg.served_model or name, eos_id=tokenizer.eos_token_id).probe()
    return SGLangServerEngine(cfg.url, cfg.served_model or name, eos_id=tokenizer.eos_token_id).probe()


def probe_engine(cfg: EngineConfig) -> dict:
    """Reach a vllm/sglang server and read its version and capabilities (raises EngineUnavailable)."""
    cls = {"vllm": VLLMServerEngine, "sglang": SGLangServerEngine}[cfg.backend]
    assert cfg.url is not None
    eng = cls(cfg.url, cfg.served_model or "", eos_id=0).probe()
    return {"engine": eng.kind, "version": eng.engine_version, **eng.capabilities}
