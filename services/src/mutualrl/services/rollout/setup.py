"""A policy's rollout worker, built from the config and its prepared policy."""

from __future__ import annotations

import dataclasses
from typing import Callable

from mutualrl.config import ExperimentConfig
from mutualrl.runtime.policy_setup import PreparedPolicy, prompt_style
from mutualrl.see import ExperienceExchange
from mutualrl.services.rollout.engine import RolloutEngine, SamplingSpec
from mutualrl.services.rollout.worker import RolloutWorker
from mutualrl.tasks import Verifier


def make_worker(cfg: ExperimentConfig, pp: PreparedPolicy, engine: RolloutEngine, exchange: ExperienceExchange,
                verifier: Verifier) -> RolloutWorker:
    """A policy's rollout worker: its engine, tokenizer and verifier, sampling G completions per prompt."""
    p = pp.config
    style = prompt_style(cfg, p)
    spec = SamplingSpec(n=cfg.budget.group_size, max_new_tokens=cfg.budget.max_new_tokens,
                        temperature=p.engine.temperature, top_k=p.engine.top_k, top_p=p.engine.top_p,
                        stop=style.stops(pp.arts.tokenizer) if style is not None else ())
    return RolloutWorker(p.name, engine, pp.arts.tokenizer, verifier, exchange, fingerprint=pp.arts.fingerprint,
                         sampling=spec, seed=cfg.seed, prompt_style=style)


def engine_sampler(engine: RolloutEngine, spec: SamplingSpec) -> Callable[..., list[list]]:
    """``sample(prompt_token_ids, n, seed, step)`` on ``engine`` at the policy's sampling settings: SGT-R's rescue
    round when the learner sits beside its engine (``mutualrl run``)."""
    def sample(prompts: list[list[int]], n: int, seed: int, step: int = 0) -> list[list]:
        return engine.generate(prompts, dataclasses.replace(spec, n=n, seed=seed))

    return sample
