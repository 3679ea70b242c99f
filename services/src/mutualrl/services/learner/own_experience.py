"""A learner's own rollouts, beside the peer intake (:mod:`~mutualrl.services.learner.peer_experience`):
collected for a step, checked like any input before a tensor is built from them, re-scored with
the learner's own verifier, and turned into training rows under the wire's field names."""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Callable

from transformers import PreTrainedTokenizerBase

from mutualrl.see import Received
from mutualrl.services.learner.objective import OWN, Rows
from mutualrl.tasks import Problem, Verifier

log = logging.getLogger("mutualrl.learner.own")


def _same_sample(a: Received, b: Received) -> bool:
    """Whether two rollouts say they sampled the same thing: prompt and completion ids and their log-probs.
    Compared only when a (prompt, sample) arrives twice, never for every row."""
    pa, pb = a.payload, b.payload
    return (list(pa.prompt_token_ids) == list(pb.prompt_token_ids) and list(pa.token_ids) == list(pb.token_ids)
            and list(pa.logprobs) == list(pb.logprobs))


class OwnIntake:
    """One policy's own ``Rollout`` messages, step by step. Rollouts of later steps wait in
    :attr:`buffer`. A step's groups must be well formed: one row per (prompt, sample index), the index below
    the group size G, and the first valid row wins. A refused row is dead-lettered with its reason
    (``own_<reason>``) and logged; a repeat of a row (a restarted rollout service publishes a step again) is
    acknowledged and counted; a row that claims a sample already taken with the same weights version but other
    content is a forgery or a broken producer: dead-lettered as ``own_conflict`` and logged as an error. All of
    it is counted in the learner's ``totals`` under ``own_*``."""

    def __init__(self, policy: str, subscription, tokenizer: PreTrainedTokenizerBase, context_limit: int,
                 vocab_size: int, *, max_lag: int | None = None, group_size: int | None = None):
        self.policy = policy
        self.group_size = group_size  # G: sample indices run 0..G-1 (None: not checked)
        self.sub = subscription
        self.tok = tokenizer
        self.context_limit = context_limit
        self.vocab_size = vocab_size
        # pipelined sampling (docs/algorithms.md §6): a rollout of step t sampled with the weights of a step before
        # t−1−max_lag is refused (``too_stale``); None checks nothing (sampling waits for each version)
        self.max_lag = max_lag
        self.buffer: list[Received] = []  # own rollouts of future steps

    def collect(self, step: int, expected: int, deadline: float, problems: dict[str, Problem], totals: Counter,
                not_consumed: Callable[[list[Received]], list[Received]], while_waiting: Callable[[],
                    None] | None = None) -> list[Received]:
        """This step's own rollouts, until ``expected`` *usable* ones arrived or the deadline:
        each is checked as it comes (:meth:`problem`) and one per (prompt, sample index) counts —
        a restarted rollout server may publish a step's sample again under new ids — so a refused
        or repeated message never takes the place of a real one. ``not_consumed`` drops what a
        checkpoint already covers."""
        have: list[Received] = []
        seen: dict[tuple[str, int], Received] = {}  # (prompt, sample) -> the row taken for it

        def admit(rows: list[Received]) -> None:
            copies = []
            for r in rows:
                reason = self.problem(r.payload, problems) or self._too_stale(r.payload, step)
                key = (r.payload.prompt_id, r.payload.sample_index)
                if reason is not None:
                    self._refuse(r, reason, totals)
                elif key not in seen:
                    seen[key] = r
                    have.append(r)
                elif seen[key].envelope.weights_version != r.envelope.weights_version or _same_sample(seen[key], r):
                    copies.append(r)  # the same sample again, or sampled again after a restart with newer weights
                else:
                    self._refuse(r, "conflict", totals)
            if copies:
                self.sub.ack(copies)
                totals["own_duplicate"] += len(copies)

        admit([r for r in self.buffer if r.payload.step == step])
        self.buffer[:] = [r for r in self.buffer if r.payload.step > step]
        stale: list[Received] = []
        while len(have) < expected:
            if while_waiting is not None:
                while_waiting()
            remaining_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
            got = not_consumed(self.sub.poll(block_ms=min(remaining_ms, 200) if remaining_ms else None))
            admit([r for r in got if r.payload.step == step])
            for r in got:
                if r.payload.step != step:
                    (self.buffer if r.payload.step > step else stale).append(r)
            if not got and remaining_ms == 0:
                break
        self._drop_stale(stale, totals)
        return have

    def _refuse(self, r: Received, reason: str, totals: Counter) -> None:
        """Dead-letter one own rollout with its reason, count it and say so in the log."""
        p = r.payload
        detail = (f"step {p.step} prompt {p.prompt_id} sample {p.sample_index} of {p.group_size}, weights version "
                  f"{r.envelope.weights_version}")
        self.sub.refuse([r], f"own_{reason}", detail)
        totals[f"own_rejected:{reason}"] += 1
        if reason == "conflict":
            log.error("own rollout %s conflicts with the one already taken for the same sample and weights version "
                      "(a forged or broken rollout service): dead-lettered", r.envelope.message_id,
                      extra={"fields": {"reason": reason, "detail": detail}})
        else:
            log.warning("own rollout %s refused (%s): dead-lettered", r.envelope.message_id, reason,
                        extra={"fields": {"reason": reason, "detail": detail}})

    def _drop_stale(self, stale: list[Received], totals: Counter) -> None:
        """Rollouts of a step already trained (they arrived late: a slow or restarted rollout service):
        dead-lettered as ``own_late``, counted and logged."""
        for r in stale:
            self._refuse(r, "late", totals)

    def _too_stale(self, p, step: int) -> str | None:
        """``too_stale`` when the rollout's weights are more than ``max_lag`` steps behind the learner's (which
        starts step t with the weights of step t−1)."""
        if self.max_lag is not None and step - 1 - int(p.weights_step) > self.max_lag:
            return "too_stale"
        return None

    def problem(self, p, problems: dict[str, Problem]) -> str | None:
        """Why an own rollout cannot be used (None when it can): it must answer one of this
        step's prompts, fit the model's context and vocabulary, and carry one log-prob per token."""
        if p.prompt_id not in problems:
            return "unknown_prompt"
        if not p.token_ids or len(p.logprobs) != len(p.token_ids):
            return "malformed"
        G = self.group_size
        if G is not None and (p.group_size != G or not 0 <= p.sample_index < G):
            return "bad_group"
        if len(p.prompt_token_ids) + len(p.token_ids) > self.context_limit:
            return "too_long"
        vocab = self.vocab_size
        if any(t < 0 or t >= vocab for t in p.token_ids) or any(t < 0 or t >= vocab for t in p.prompt_token_ids):
            return "bad_token"
        return None

    def rescore(self, ok: list[Received], problems: dict[str, Problem], verifier: Verifier,
                totals: Counter) -> list[Received]:
        """Own rewards re-scored with the learner's verifier (the one its peer intake checks peers with):
        a row whose claimed reward differs is re-scored and counted (``own_rescored``), never trained on
        with the claim."""
        if ok:
            texts = self.tok.batch_decode([list(r.payload.token_ids) for r in ok], skip_special_tokens=True,
                                          clean_up_tokenization_spaces=False)
            scores = verifier.score_many([problems[r.payload.prompt_id] for r in ok], texts)
            for r, score in zip(ok, scores):
                if float(score) != r.payload.reward:
                    totals["own_rescored"] += 1
                    r.payload.reward = float(score)
        return ok

    def rows(self, own: list[Received]) -> Rows:
        """The step's own rows, in the order given: every token enters the loss; ℓ̄ is the mean of the sampler's
        log-probs."""
        rows = Rows()
        for r in own:
            p = r.payload
            lps = list(p.logprobs)
            rows.add(prompt_token_ids=p.prompt_token_ids, token_ids=p.token_ids, logprobs=lps, mask=[1.0] * len(lps),
                     reward=p.reward,
                     prompt_id=p.prompt_id, source_policy=self.policy, kind=OWN,
                     source_mean_logprob=sum(lps) / len(lps) if lps else 0.0)
        return rows
