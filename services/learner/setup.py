"""A policy's learner, built from the config and its prepared policy."""

from __future__ import annotations

import copy

from mutualrl.config import ExperimentConfig
from mutualrl.config.schema import OptimConfig
from mutualrl.models.policy import tokenizer_fingerprint
from mutualrl.runtime.policy_setup import PreparedPolicy, peer_tokenizer, prepare_policy
from mutualrl.see import ExperienceExchange
from mutualrl.services.learner.learner import Learner, LearnerSettings
from mutualrl.services.learner.peer_experience import PeerIntake, TokenizerRegistry
from mutualrl.tasks import Verifier
from mutualrl.thl import ThlBudget
from mutualrl.weights import WeightStore


def learner_optim(cfg: ExperimentConfig, optim: OptimConfig, n_peers: int) -> OptimConfig:
    """The optimiser settings a learner runs with: HACPO's paper schedule takes
    ``self_minibatches + cross_minibatches · peers`` updates per step, and with
    ``sharing.hacpo.scale_lr`` the learning rate is divided by that count (docs/algorithms.md §2.8)."""
    h = cfg.sharing.hacpo
    if cfg.sharing.mode != "hacpo" or h.schedule != "paper" or not h.scale_lr:
        return optim
    updates = h.self_minibatches + h.cross_minibatches * max(1, n_peers)
    return optim.model_copy(update={"lr": optim.lr / updates})


def make_learner(
    cfg: ExperimentConfig, pp: PreparedPolicy, exchange: ExperienceExchange, store: WeightStore, registry: TokenizerRegistry,
    verifier: Verifier, peer_deadline_s: float = 5.0,
) -> Learner:
    p = pp.config
    ref = None
    if cfg.algorithm.kl_coef > 0:
        ref = copy.deepcopy(pp.arts.model).eval()
        for q in ref.parameters():
            q.requires_grad_(False)
    intake = PeerIntake(
        pp.arts.tokenizer, verifier, registry, ThlBudget(cfg.thl.max_unaligned, cfg.thl.require_roundtrip),
        cfg.sharing.max_version_lag, p.tokenizer.chat_template, cfg.thl.placement,
    )
    peers = [q.name for q in cfg.policies if q.name != p.name]
    settings = LearnerSettings(
        group_size=cfg.budget.group_size, algorithm=cfg.algorithm, sharing=cfg.sharing, optim=learner_optim(cfg, p.optim, len(peers)),
        max_new_tokens=cfg.budget.max_new_tokens, device=p.engine.device, peer_deadline_s=peer_deadline_s,
    )
    return Learner(p.name, pp.arts.model, pp.arts.tokenizer, exchange, intake, store, settings, peers=peers, ref_model=ref)


def service_learner(cfg: ExperimentConfig, index: int, task, verifier: Verifier, cache, exchange: ExperienceExchange, store: WeightStore,
                    phase=lambda s: None) -> tuple[PreparedPolicy, Learner]:
    """A learner service's learner: its own policy (loaded, warm-started from the cache) and of each
    peer only its tokenizer — THL carries their text — so its memory does not grow with the number
    or size of its peers (benchmarks/bench_learner_memory.py)."""
    pp = prepare_policy(cfg, index, task, verifier, cache, phase)
    tokenizers = TokenizerRegistry()
    tokenizers.register(pp.arts.fingerprint, pp.arts.tokenizer)
    for i in range(len(cfg.policies)):
        if i != index:
            tok = peer_tokenizer(cfg, i, task, cache)
            tokenizers.register(tokenizer_fingerprint(tok), tok)
    return pp, make_learner(cfg, pp, exchange, store, tokenizers, verifier, peer_deadline_s=cfg.launcher.rollout_deadline_s)
