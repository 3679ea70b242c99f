"""Turning an experiment config into the planner's inputs (seeded step costs, gang shapes)."""

from __future__ import annotations

from typing import Mapping

from mutualrl.config import ExperimentConfig
from mutualrl.config.schema import PolicyConfig
from mutualrl.services.mwra.planner import PolicyDemand, seed_step_cost


def estimate_params(p: PolicyConfig) -> float:
    """Parameters of a built model from its shape (12*L*h^2 for the blocks plus the
    embeddings); a loaded model's real count is passed in by the caller when known."""
    m = p.model
    return 12.0 * m.num_layers * m.hidden_size**2 + 2.0 * p.tokenizer.vocab_size * m.hidden_size


def tokens_per_step(cfg: ExperimentConfig) -> float:
    """Tokens a step generates and trains on: prompts x G x (prompt + completion), the prompt
    taken as long as the completion budget."""
    b = cfg.budget
    return float(b.prompts_per_step * b.group_size * 2 * b.max_new_tokens)


def demand_for(cfg: ExperimentConfig, p: PolicyConfig, params: float | None = None) -> PolicyDemand:
    """What a policy asks of the GPUs: its step cost (given or estimated from its size and tokens) and its limits."""
    r = p.resources
    w, f = seed_step_cost(params or estimate_params(p), tokens_per_step(cfg), gpu_flops=cfg.mwra.gpu_flops)
    return PolicyDemand(
        name=p.name, step_gpu_seconds=r.step_gpu_seconds or w,
        generate_fraction=r.generate_fraction if r.generate_fraction is not None else f,
        rollout_tp=r.rollout_tp, rollout_min_replicas=r.rollout_replicas, learner_min_gpus=r.learner_gpus,
        granularity=r.granularity,
        max_gpus=r.max_gpus, scaling_efficiency=r.scaling_efficiency,
    )


def demands_from_config(cfg: ExperimentConfig, params: Mapping[str, float] | None = None) -> list[PolicyDemand]:
    """Every policy's demand, in the config's order."""
    params = params or {}
    return [demand_for(cfg, p, params.get(p.name)) for p in cfg.policies]
