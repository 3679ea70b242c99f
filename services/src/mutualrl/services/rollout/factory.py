"""Build the rollout engine a policy's config names."""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mutualrl.config import ExperimentConfig
from mutualrl.config.schema import EngineConfig
from mutualrl.models.precision import Precision
from mutualrl.services.rollout.engine import RolloutEngine
from mutualrl.services.rollout.hf_engine import HFEngine
from mutualrl.services.rollout.http_engines import EngineUnavailable, SGLangServerEngine, VLLMServerEngine
from mutualrl.weights import WeightReceiver, WeightStore, hf_receiver
from mutualrl.weights.deltas import DeltaReceiver
from mutualrl.weights.groups import parse_address, resolve_backend
from mutualrl.weights.shm import ShmReceiver


def build_engine(cfg: EngineConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, store: WeightReceiver,
                 name: str,
                 collective: bool = False, share: bool = False, precision: Precision | None = None,
                 adopt: bool = False) -> RolloutEngine:
    """``hf`` samples a private copy of ``model`` (loading through ``store``); ``vllm``/``sglang``
    probe their server and raise :class:`~mutualrl.services.rollout.http_engines.EngineUnavailable`
    naming what is missing. ``collective``: the server takes weights from the learner's broadcast
    (it joins the weight group; see :func:`join_engine_group`), not from a directory. ``share`` (hf, in the
    learner's process): sample ``model`` itself, not a copy (mutualrl.weights.shared). ``precision``: the
    policy's (bf16-mixed samples in bf16, docs/algorithms.md §7.1). ``adopt``: hf takes ``model`` as its own
    instead of copying it (the caller never uses it again: one copy of the weights, not two)."""
    if cfg.backend == "hf":
        return HFEngine(model, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, store=store,
                        device=cfg.device, name=name, share=share, precision=precision,
                        adopt=adopt)
    assert cfg.url is not None
    if store.root is None and not collective:
        raise ValueError(f"the {cfg.backend} engine loads weights from a directory; the run needs a directory weight "
                         "store")
    if cfg.backend == "vllm":
        return VLLMServerEngine(cfg.url, cfg.served_model or name, eos_id=tokenizer.eos_token_id).probe()
    return SGLangServerEngine(cfg.url, cfg.served_model or name, eos_id=tokenizer.eos_token_id).probe()


def probe_engine(cfg: EngineConfig) -> dict:
    """Reach a vllm/sglang server and read its version and capabilities (raises EngineUnavailable)."""
    cls = {"vllm": VLLMServerEngine, "sglang": SGLangServerEngine}[cfg.backend]
    assert cfg.url is not None
    eng = cls(cfg.url, cfg.served_model or "", eos_id=0).probe()
    return {"engine": eng.kind, "version": eng.engine_version, **eng.capabilities}


def rollout_transport(cfg: ExperimentConfig, index: int, weights_dir, weights_group: str | None,
                      newest=None) -> WeightReceiver:
    """What the rollout service loads weights through: the shared directory (filesystem); with the
    collective transport, the hf engine's receiving end of the learner's weight group (it joins each
    announced version's group; ``newest()`` — the newest announced version — lets it give up one
    that was superseded) — a vLLM/SGLang server joins once itself (:func:`join_engine_group`)."""
    p = cfg.policies[index]
    if p.engine.backend != "hf":
        return WeightStore(weights_dir)
    # an hf engine takes deltas whenever its learner sends them (a whole version passes through)
    if cfg.weights.transport == "filesystem":
        return DeltaReceiver(WeightStore(weights_dir))
    if cfg.weights.transport == "shm":
        return DeltaReceiver(ShmReceiver())
    host, port = parse_address(weights_group, p.name)
    backend = resolve_backend(cfg.weights.backend, p.engine.backend, p.engine.device)
    return hf_receiver(host, port, 1, 1, backend, cfg.weights.timeout_s,
                       device=p.engine.device if backend == "nccl" else "cpu", newest=newest)


def join_engine_group(cfg: ExperimentConfig, index: int, engine: RolloutEngine, weights_group: str | None) -> None:
    """A vLLM/SGLang server's workers join the learner's weight group through the engine's own
    route (docs/engines.md §4); refuses a server whose worker count the learner did not plan for."""
    p = cfg.policies[index]
    if cfg.weights.transport != "collective" or not isinstance(engine, (VLLMServerEngine, SGLangServerEngine)):
        return
    host, port = parse_address(weights_group, p.name)
    receivers = engine.weight_receivers()
    if receivers != p.resources.rollout_tp:
        raise EngineUnavailable(f"{p.name}: the {engine.kind} server at {p.engine.url} has {receivers} workers but "
                                f"resources.rollout_tp is {p.resources.rollout_tp}: the learner sizes the weight group "
                                "from rollout_tp")
    if isinstance(engine, SGLangServerEngine):
        engine.join_weight_group(host, port, 1 + receivers,
                                 backend=resolve_backend(cfg.weights.backend, "sglang", p.engine.device),
                                 timeout_s=cfg.weights.timeout_s)
    else:
        engine.join_weight_group(host, port, 1 + receivers, timeout_s=cfg.weights.timeout_s)
