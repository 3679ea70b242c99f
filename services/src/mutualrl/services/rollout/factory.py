"""Build the rollout engine a policy's config names."""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mutualrl.config import ExperimentConfig
from mutualrl.config.schema import EngineConfig
from mutualrl.models.precision import Precision
from mutualrl.services.rollout.engine import EngineSetup, RolloutEngine
from mutualrl.services.rollout.http_engines import EngineUnavailable
from mutualrl.services.rollout.registry import engine_class
from mutualrl.weights import WeightReceiver, WeightStore, hf_receiver
from mutualrl.weights.deltas import DeltaReceiver
from mutualrl.weights.groups import parse_address, resolve_backend
from mutualrl.weights.shm import ShmReceiver


def build_engine(cfg: EngineConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, store: WeightReceiver,
                 name: str,
                 collective: bool = False, share: bool = False, precision: Precision | None = None,
                 adopt: bool = False) -> RolloutEngine:
    """The engine ``cfg.backend`` names, built by its registered class (mutualrl.services.rollout.registry):
    ``hf`` samples a private copy of ``model`` (loading through ``store``); a server engine probes its server and
    raises :class:`~mutualrl.services.rollout.http_engines.EngineUnavailable` naming what is missing. See
    :class:`~mutualrl.services.rollout.engine.EngineSetup` for ``collective``, ``share``, ``precision`` and
    ``adopt``."""
    setup = EngineSetup(model, tokenizer, store, name, collective, share, precision, adopt)
    return engine_class(cfg.backend).from_config(cfg, setup)


def probe_engine(cfg: EngineConfig) -> dict:
    """Reach the server a config names and read its version and capabilities (raises EngineUnavailable)."""
    return engine_class(cfg.backend).probe_config(cfg)


def rollout_transport(cfg: ExperimentConfig, index: int, weights_dir, weights_group: str | None,
                      newest=None) -> WeightReceiver:
    """What the rollout service loads weights through: the shared directory (filesystem); with the
    collective transport, the hf engine's receiving end of the learner's weight group (it joins each
    announced version's group; ``newest()`` — the newest announced version — lets it give up one
    that was superseded) — a vLLM/SGLang server joins once itself (:func:`join_engine_group`)."""
    p = cfg.policies[index]
    if not p.engine.facts.in_process:
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
    if cfg.weights.transport != "collective" or engine.facts.in_process:
        return
    host, port = parse_address(weights_group, p.name)
    receivers = engine.weight_receivers()
    if receivers != p.resources.rollout_tp:
        raise EngineUnavailable(f"{p.name}: the {engine.kind} server at {p.engine.url} has {receivers} workers but "
                                f"resources.rollout_tp is {p.resources.rollout_tp}: the learner sizes the weight group "
                                "from rollout_tp")
    engine.join_weight_group(host, port, 1 + receivers,  # type: ignore[attr-defined]
                             backend=resolve_backend(cfg.weights.backend, p.engine.backend, p.engine.device),
                             timeout_s=cfg.weights.timeout_s)
