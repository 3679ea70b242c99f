"""The rollout worker: sample the step's prompts, verify, publish experience through SEE."""

from __future__ import annotations

import statistics
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

from transformers import PreTrainedTokenizerBase

from mutualrl.models.generation import Sample, cut_at_stop, text_decoder
from mutualrl.models.policy import PromptStyle, encode_prompt
from mutualrl.runtime.pacing import pace
from mutualrl.see import ExperienceExchange
from mutualrl.services.rollout.engine import RolloutEngine, SamplingSpec
from mutualrl.tasks import Problem, Verifier
from mutualrl.v1 import experience_pb2 as pb


@dataclass
class StepRollouts:
    """What one rollout step produced and published."""
    step: int
    rewards: dict[str, list[float]] = field(default_factory=dict)  # prompt_id -> G rewards
    published: int = 0
    successes_published: int = 0
    message_ids: list[str] = field(default_factory=list)  # the Rollout messages published (a service's ledger)
    generate_s: float = 0.0  # engine time of the step's generation (MWRA's measured cost)
    tokens: int = 0  # completion tokens generated
    weights_version: int = 0  # the engine's version when the step was sampled

    @property
    def reward_mean(self) -> float:
        """The mean reward of the step's rollouts."""
        flat = [r for rs in self.rewards.values() for r in rs]
        return sum(flat) / len(flat) if flat else 0.0

    @property
    def count(self) -> int:
        """How many rollouts the step sampled."""
        return sum(len(rs) for rs in self.rewards.values())


@dataclass
class RolloutWorker:
    """One per policy. Publishes, per step: a ``Rollout`` per completion, an
    ``AdvantageStats`` per prompt, and a ``VerifiedSuccess`` per distinct
    verified-correct completion (what SGT peers consume)."""

    policy: str
    engine: RolloutEngine
    tokenizer: PreTrainedTokenizerBase
    verifier: Verifier
    exchange: ExperienceExchange
    fingerprint: str = field(kw_only=True)
    sampling: SamplingSpec = field(kw_only=True)
    seed: int = field(default=0, kw_only=True)
    prompt_style: PromptStyle | None = field(default=None, kw_only=True)
    total_rollouts: int = field(default=0, init=False)
    # the learner step of the weights the engine serves (a WeightsFollower's served_step): each Rollout says it
    weights_step: Callable[[], int] = field(default=lambda: 0, kw_only=True)

    def _spec(self, step: int) -> SamplingSpec:
        # A distinct, reproducible stream per (run seed, policy, step).
        s = zlib.crc32(f"{self.seed}:{self.policy}:{step}".encode())
        return SamplingSpec(**{**self.sampling.__dict__, "seed": s})

    def run_step(self, step: int, problems: list[Problem]) -> StepRollouts:
        """Sample G completions per prompt, score them and publish the step's experience on SEE."""
        version, weights_step = self.engine.info().weights_version, self.weights_step()
        prompt_ids = [encode_prompt(self.tokenizer, p.prompt, self.prompt_style) for p in problems]
        t0 = time.monotonic()
        groups = self.engine.generate(prompt_ids, self._spec(step))
        pace("generate", self.policy, t0)  # benchmarks of the schedule only (MUTUALRL_PACE)
        result = StepRollouts(step, generate_s=time.monotonic() - t0, weights_version=version)
        result.tokens = sum(len(s.token_ids) for group in groups for s in group)
        G = self.sampling.n
        flat = [s for group in groups for s in group]
        all_texts = self.tokenizer.batch_decode([s.token_ids for s in flat], skip_special_tokens=True,
                                          clean_up_tokenization_spaces=False)
        stops = self.prompt_style.stops(self.tokenizer) if self.prompt_style else ()
        if stops:  # a completion-form policy: cut each completion at its first stop string (tokens and text)
            flat, all_texts = self._cut(flat, stops)
            sizes = [len(g) for g in groups]
            groups = [flat[sum(sizes[:i]):sum(sizes[: i + 1])] for i in range(len(sizes))]
        all_canonical = self._canonical(flat, all_texts)
        offset = 0
        for problem, p_ids, group in zip(problems, prompt_ids, groups):
            texts = all_texts[offset : offset + len(group)]
            canonical = all_canonical[offset : offset + len(group)]
            offset += len(group)
            rewards = self.verifier.score_many([problem] * len(group), texts)
            result.rewards[problem.prompt_id] = rewards
            seen_success: set[str] = set()
            for i, (s, text, r, canon) in enumerate(zip(group, texts, rewards, canonical)):
                # the fields a Rollout and a VerifiedSuccess share, named as on the wire
                common = dict(prompt_id=problem.prompt_id, prompt_text=problem.prompt, completion_text=text,
                              token_ids=s.token_ids, logprobs=s.logprobs, reward=r, step=step,
                              tokenizer_fingerprint=self.fingerprint, canonical=canon)
                rollout = pb.Rollout(**common, prompt_token_ids=p_ids, verified=True, finish_reason=s.finish_reason,
                                     sample_index=i, group_size=G, weights_step=weights_step)
                mid = self.exchange.publish(rollout, self.policy, version)
                result.published += 1
                if mid:
                    result.message_ids.append(mid)
                if r > 0 and text not in seen_success:
                    seen_success.add(text)
                    success = pb.VerifiedSuccess(**common, verifier=self.verifier.name,
                                                 verifier_version=self.verifier.version)
                    self.exchange.publish(success, self.policy, version)
                    result.successes_published += 1
            self.exchange.publish(_advantage_stats(problem.prompt_id, step, rewards), self.policy, version)
        self.total_rollouts += result.count
        return result

    def _cut(self, samples: list[Sample], stops: tuple[str, ...]) -> tuple[list[Sample], list[str]]:
        decode = text_decoder(self.tokenizer)
        cut = [cut_at_stop(decode, s, stops) for s in samples]
        return [c[0] for c in cut], [c[1] for c in cut]

    def _canonical(self, samples: list, texts: list[str]) -> list[bool]:
        """Whether each sampled path is the canonical encoding of its text: computed once here, in
        one batch for the step, rather than by every receiver's THL (docs/algorithms.md §3.2)."""
        eos = self.tokenizer.eos_token_id
        fresh = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        sampled = [list(s.token_ids[:-1]) if s.token_ids and s.token_ids[-1] == eos else list(s.token_ids)
                   for s in samples]
        return [f == s for f, s in zip(fresh, sampled)]


def _advantage_stats(prompt_id: str, step: int, rewards: list[float]) -> pb.AdvantageStats:
    """One prompt group's reward statistics, as XGRPO's receivers pool them."""
    return pb.AdvantageStats(
        prompt_id=prompt_id, step=step, count=len(rewards), mean=statistics.fmean(rewards),
        std=statistics.stdev(rewards) if len(rewards) > 1 else 0.0,
        success_rate=sum(1 for r in rewards if r > 0) / len(rewards),
    )
