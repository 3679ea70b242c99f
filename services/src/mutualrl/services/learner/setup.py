"""A policy's learner, built from the config and its prepared policy."""

from __future__ import annotations

import copy

import torch

from mutualrl.config import ExperimentConfig
from mutualrl.config.engines import engine_facts
from mutualrl.config.schema import OptimConfig, SharingConfig
from mutualrl.models.policy import tokenizer_fingerprint
from mutualrl.models.precision import Precision
from mutualrl.runtime.policy_setup import PreparedPolicy, peer_tokenizer, prepare_policy, prompt_style
from mutualrl.see import ExperienceExchange
from mutualrl.services.learner.hinted_rescue import HintedRescue, SampleFn
from mutualrl.services.learner.learner import Learner
from mutualrl.services.learner.modes import MODES
from mutualrl.services.learner.peer_experience import PeerIntake, TokenizerRegistry
from mutualrl.services.learner.rescue_requests import ExchangeSampler
from mutualrl.services.learner.settings import LearnerSettings
from mutualrl.tasks import Verifier
from mutualrl.thl import ThlBudget
from mutualrl.weights import WeightSender, WeightStore
from mutualrl.weights.deltas import DeltaSender
from mutualrl.weights.groups import learner_sender, parse_address, resolve_backend
from mutualrl.weights.shm import ShmSender


def receiver_sharing(cfg: ExperimentConfig, policy: str) -> tuple[list[str], SharingConfig]:
    """The peers ``policy``'s learner reads and the sharing it runs under (its incoming edges of the sharing graph;
    without edges every other policy under ``sharing.mode``)."""
    return cfg.sharing.for_receiver(policy, [q.name for q in cfg.policies])


def learner_optim(sharing: SharingConfig, optim: OptimConfig, n_peers: int) -> OptimConfig:
    """The optimiser settings a learner runs with: its policy's, as its sharing mode changes them
    (HACPO's paper schedule divides the learning rate by its updates per step, docs/algorithms.md §2.8)."""
    return MODES.get(sharing.mode).optim(sharing, optim, n_peers)


BEHAVIOUR_GAP_BOUND = 0.1
"""Nats: under ``behaviour_correction: auto`` a step whose own tokens' 99th-percentile gap between the sampler's
and the learner's log-probs exceeds this turns the correction on (docs/algorithms.md §7.1). fp32 on one engine
measured a p99 of 4e-5 nats on SmolLM2-135M, bf16 autocast 0.11 and a bf16 copy of the weights 0.21
(benchmarks/bench_bf16_gap.py); a per-token ratio of e^0.1 = 1.105 spends half the 0.2 clip range on noise."""


def behaviour_correction(cfg: ExperimentConfig, backend: str, precision: Precision) -> bool:
    """Whether a learner starts with the behaviour correction on (``algorithm.behaviour_correction``; auto:
    when its sampler computes other numbers than it — not fp32, or not the in-process transformers engine)."""
    setting = cfg.algorithm.behaviour_correction
    if setting != "auto":
        return setting == "on"
    return not precision.exact or not engine_facts(backend).learner_numbers


def make_learner(
    cfg: ExperimentConfig, pp: PreparedPolicy, exchange: ExperienceExchange, store: WeightSender,
    registry: TokenizerRegistry, verifier: Verifier, peer_deadline_s: float = 5.0, device: str | None = None,
    rescue_sample: SampleFn | None = None, shares_host: bool = True,
) -> Learner:
    """A policy's learner from the config: its optimiser settings per mode, its peer intake, with a KL term a
    frozen reference model, and under SGT-R its rescue round on ``rescue_sample`` (the policy's own engine).
    ``shares_host``: it runs in a process of its own beside others, so gives its update's freed pages back to the
    host (False where one process holds every policy: mutualrl.runtime.memory)."""
    p = pp.config
    ref = None
    if cfg.algorithm.kl_coef > 0:
        ref = copy.deepcopy(pp.arts.model).eval()
        for q in ref.parameters():
            q.requires_grad_(False)
    intake = PeerIntake(
        pp.arts.tokenizer, verifier, registry, ThlBudget(cfg.thl.max_unaligned, cfg.thl.require_roundtrip),
        cfg.sharing.max_version_lag, prompt_style(cfg, p), cfg.thl.placement,
    )
    peers, sharing = receiver_sharing(cfg, p.name)
    settings = LearnerSettings(
        group_size=cfg.budget.group_size, algorithm=cfg.algorithm, sharing=sharing,
        optim=learner_optim(sharing, p.optim, len(peers)),
        max_new_tokens=cfg.budget.max_new_tokens, device=device or p.engine.device, peer_deadline_s=peer_deadline_s,
        staleness=cfg.async_, record_edges=cfg.sharing.edges is not None, temperature=p.engine.temperature,
        no_signal_warn_steps=cfg.eval.no_signal_steps, precision=pp.precision,
        behaviour_correction=behaviour_correction(cfg, p.engine.backend, pp.precision),
        behaviour_gap_bound=BEHAVIOUR_GAP_BOUND if cfg.algorithm.behaviour_correction == "auto" else None,
        gradient_checkpointing=p.model.gradient_checkpointing, return_freed_memory=shares_host,
    )
    learner = Learner(p.name, pp.arts.model, pp.arts.tokenizer, exchange, intake, store, settings, peers=peers,
                      ref_model=ref)
    if MODES.get(sharing.mode).samples_rescues:
        if rescue_sample is None:
            raise ValueError(f"policy {p.name!r}: sharing mode {sharing.mode} samples rescues with the policy's own "
                             "engine, and this learner was given none")
        section = getattr(sharing, sharing.mode)  # the mode's own settings
        learner.rescue = HintedRescue(p.name, section, pp.arts.tokenizer, prompt_style(cfg, p), verifier,
                                      cfg.task.answer_format or "whole", rescue_sample, learner.updater.logprobs_now,
                                      group_size=cfg.budget.group_size, seed=cfg.seed,
                                      max_context=learner.context_limit, max_new_tokens=cfg.budget.max_new_tokens)
    return learner


def delta_dtype(cfg: ExperimentConfig, backend: str, precision: Precision) -> torch.dtype | None:
    """The dtype a learner sends its versions as deltas in (``weights.deltas``), or None for whole versions: the
    dtype its engine samples in; auto only when that is 16-bit (docs/algorithms.md §7.3)."""
    if cfg.weights.deltas == "off" or cfg.weights.transport == "collective" or not engine_facts(backend).weight_deltas:
        return None
    dtype = precision.autocast or precision.weights
    if cfg.weights.deltas == "auto" and dtype.itemsize > 2:
        return None
    return dtype


def with_deltas(cfg: ExperimentConfig, pp: PreparedPolicy, sender: WeightSender) -> WeightSender:
    """``sender``, sending deltas when :func:`delta_dtype` says so."""
    dtype = delta_dtype(cfg, pp.config.engine.backend, pp.precision)
    return sender if dtype is None else DeltaSender(sender, dtype, cfg.weights.delta_max_share)


def service_learner(cfg: ExperimentConfig, index: int, task, verifier: Verifier, cache, exchange: ExperienceExchange,
                    store: WeightSender,
                    phase=lambda s: None, shard=None, device: str | None = None) -> tuple[PreparedPolicy, Learner]:
    """A learner service's learner: its own policy (loaded, warm-started from the cache) and of each
    peer only its tokenizer — THL carries their text — so its memory does not grow with the number
    or size of its peers (benchmarks/bench_learner_memory.py). ``shard(model)`` splits the model
    over a sharded learner's ranks (services/src/mutualrl/services/learner/ranks.py) before its optimiser is built on
    ``device``."""
    pp = prepare_policy(cfg, index, task, verifier, cache, phase)
    if shard is not None:
        pp.arts.model.to(device or pp.config.engine.device)
        shard(pp.arts.model)
    tokenizers = TokenizerRegistry()
    tokenizers.register(pp.arts.fingerprint, pp.arts.tokenizer)
    for i in range(len(cfg.policies)):
        if i != index:
            tok = peer_tokenizer(cfg, i, task, cache)
            tokenizers.register(tokenizer_fingerprint(tok), tok)
    rescue = None
    if MODES.get(receiver_sharing(cfg, pp.config.name)[1].mode).samples_rescues:  # on its rollout service
        rescue = ExchangeSampler(pp.config.name, exchange, pp.arts.model.get_input_embeddings().num_embeddings,
                                 deadline_s=cfg.launcher.rollout_deadline_s)
    return pp, make_learner(cfg, pp, exchange, with_deltas(cfg, pp, store), tokenizers, verifier,
                            peer_deadline_s=cfg.launcher.rollout_deadline_s, device=device, rescue_sample=rescue)


def learner_transport(cfg: ExperimentConfig, index: int, weights_dir, weights_group: str | None) -> WeightSender:
    """Where the learner publishes weights: the shared directory (filesystem), or the weight group
    it hosts at ``weights_group`` (collective; for a vLLM/SGLang server this blocks until the
    server's workers joined)."""
    if cfg.weights.transport == "filesystem":
        return WeightStore(weights_dir)
    p = cfg.policies[index]
    if cfg.weights.transport == "shm":
        return ShmSender(weights_dir, p.name, cfg.weights.shm_dir)
    host, port = parse_address(weights_group, p.name)
    backend = resolve_backend(cfg.weights.backend, p.engine.backend, p.engine.device)
    # one engine: its TP workers (docs/engines.md §4)
    receivers = 1 if p.engine.facts.in_process else p.resources.rollout_tp
    device = p.engine.device if p.engine.device.startswith("cuda") else ("cuda" if backend == "nccl" else "cpu")
    return learner_sender(p.engine.backend, host, port, receivers, backend, cfg.weights.timeout_s, device)
