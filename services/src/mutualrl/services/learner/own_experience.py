"""A learner's own rollouts, beside the peer intake (:mod:`~mutualrl.services.learner.peer_experience`):
collected for a step, checked like any input before a tensor is built from them, re-scored with
the learner's own verifier, and turned into training rows under the wire's field names."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from typing import Callable

from transformers import PreTrainedTokenizerBase

from mutualrl.see import Received
from mutualrl.services.learner.objective import OWN, Rows
from mutualrl.tasks import Problem, Verifier

log = logging.getLogger("mutualrl.learner.own")


TRAINED_WINDOW = 16
"""Steps whose trained rows an intake remembers (their digests), so a copy arriving after its step was trained is
compared with what was trained: a differing one is a conflict, found late but loudly."""


def sample_digest(r: Received) -> bytes:
    """What a rollout says it sampled, bit for bit: its weights version and payload (a byte-identical redelivery
    has the same digest; any other content, a different one)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(str(r.envelope.weights_version).encode())
    h.update(r.payload.SerializeToString(deterministic=True))
    return h.digest()


class OwnIntake:
    """One policy's own ``Rollout`` messages, step by step, trusting nothing the rollout key can forge.

    Rollouts of later steps wait in :attr:`buffer`. A step's groups must be well formed: one row per (prompt,
    sample index), the index below the group size G, sampled with weights the learner published (a version it
    never published, or weights of a step it has not trained, is ``unknown_version``). **Two copies of a sample
    fail closed** (docs/architecture.md, "Threat model"): a holder of the rollout service's key is
    indistinguishable from the service, so when two valid copies of one (prompt, sample) differ — whatever their
    order, weights version or step — neither is trained: both are dead-lettered as ``own_conflict`` and an error
    names both message ids and the producer. A copy that arrives after its step was trained is compared with the
    trained row's digest (:data:`TRAINED_WINDOW` steps back): differing, it is a conflict too (the alert fires,
    even though the first copy was trained). A byte-identical redelivery is acknowledged and counted
    (``own_duplicate``), nothing more. Every refusal is dead-lettered with its reason (``own_<reason>``) and the
    fields that decided it, logged, and counted in the learner's ``totals`` under ``own_*``."""

    def __init__(self, policy: str, subscription, tokenizer: PreTrainedTokenizerBase, context_limit: int,
                 vocab_size: int, *, max_lag: int | None = None, group_size: int | None = None,
                 newest_version: Callable[[], int] | None = None):
        self.policy = policy
        self.group_size = group_size  # G: sample indices run 0..G-1 (None: not checked)
        self.sub = subscription
        self.tok = tokenizer
        self.context_limit = context_limit
        self.vocab_size = vocab_size
        # pipelined sampling (docs/algorithms.md §6): a rollout of step t sampled with the weights of a step before
        # t−1−max_lag is refused (``too_stale``); None checks nothing (sampling waits for each version)
        self.max_lag = max_lag
        self.newest_version = newest_version  # the newest weights version the learner published (None: unchecked)
        self.buffer: list[Received] = []  # own rollouts of future steps
        # (step, prompt, sample) -> (message id, digest) of the rows trained in the last TRAINED_WINDOW steps
        self.trained: dict[tuple[int, str, int], tuple[str, bytes]] = {}

    def collect(self, step: int, expected: int, deadline: float, problems: dict[str, Problem], totals: Counter,
                not_consumed: Callable[[list[Received]], list[Received]], while_waiting: Callable[[],
                    None] | None = None) -> list[Received]:
        """This step's own rollouts, until every one of its ``expected`` samples is settled — taken, or lost to a
        conflict — or the deadline: each is checked as it comes (:meth:`problem`). Returns the rows to train,
        which the intake remembers (their digests) for comparison with late copies. ``not_consumed`` drops what a
        checkpoint already covers."""
        have: dict[tuple[str, int], Received] = {}  # (prompt, sample) -> the row taken for it
        conflicted: dict[tuple[str, int], str] = {}  # (prompt, sample) -> the message id first taken for it

        def admit(rows: list[Received]) -> None:
            self._admit(rows, step, problems, totals, have, conflicted)

        admit([r for r in self.buffer if r.payload.step == step])
        self.buffer[:] = [r for r in self.buffer if r.payload.step > step]
        stale: list[Received] = []
        while len(have) + len(conflicted) < expected:
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
        taken = list(have.values())
        self._remember(step, taken)
        return taken

    def _admit(self, rows: list[Received], step: int, problems: dict[str, Problem], totals: Counter,
               have: dict[tuple[str, int], Received], conflicted: dict[tuple[str, int], str]) -> None:
        """Check each of ``rows`` and take it into ``have``, or refuse it; two differing copies of a sample move it
        to ``conflicted`` (neither is trained)."""
        copies = []
        for r in rows:
            reason = self.problem(r.payload, problems) or self._too_stale(r.payload, step) or self._unknown(r)
            key = (r.payload.prompt_id, r.payload.sample_index)
            if reason is not None:
                self._refuse(r, reason, totals)
            elif key in conflicted:
                self._conflict([r], conflicted[key], totals)
            elif key not in have:
                have[key] = r
            elif sample_digest(have[key]) == sample_digest(r):
                copies.append(r)  # the same message content again (a redelivery, a republished step)
            else:
                first = have.pop(key)
                conflicted[key] = first.envelope.message_id
                self._conflict([first, r], first.envelope.message_id, totals)
        if copies:
            self.sub.ack(copies)
            totals["own_duplicate"] += len(copies)

    def _remember(self, step: int, taken: list[Received]) -> None:
        """The digests of ``step``'s rows (to be trained), kept for TRAINED_WINDOW steps."""
        for r in taken:
            p = r.payload
            self.trained[(step, p.prompt_id, p.sample_index)] = (r.envelope.message_id, sample_digest(r))
        for key in [k for k in self.trained if k[0] <= step - TRAINED_WINDOW]:
            del self.trained[key]

    def _refuse(self, r: Received, reason: str, totals: Counter, **fields) -> None:
        """Dead-letter one own rollout with its reason and deciding fields, count it and log it (a warning)."""
        p = r.payload
        detail = {"step": p.step, "prompt_id": p.prompt_id, "sample_index": p.sample_index,
                  "group_size": p.group_size, "weights_version": r.envelope.weights_version,
                  "weights_step": p.weights_step, **self._deciding(r, reason), **fields}
        self.sub.refuse([r], f"own_{reason}", json.dumps(detail))
        totals[f"own_rejected:{reason}"] += 1
        log.warning("own rollout %s refused (%s): dead-lettered", r.envelope.message_id, reason,
                    extra={"fields": {"policy": self.policy, "reason": reason, "message_id": r.envelope.message_id,
                                      "producer": r.envelope.producer, **detail}})

    def _deciding(self, r: Received, reason: str) -> dict:
        """The fields that decided a refusal, beyond the row's identity."""
        p = r.payload
        if reason == "too_long":
            return {"length": len(p.prompt_token_ids) + len(p.token_ids), "limit": self.context_limit}
        if reason == "bad_token":
            return {"vocab_size": self.vocab_size}
        if reason == "unknown_version":
            return {"newest_published": self.newest_version() if self.newest_version is not None else None}
        if reason == "too_stale":
            return {"max_lag": self.max_lag}
        if reason == "malformed":
            return {"tokens": len(p.token_ids), "logprobs": len(p.logprobs)}
        return {}

    def _conflict(self, rows: list[Received], first_id: str, totals: Counter, trained_at: int | None = None) -> None:
        """Copies of one sample that differ: every one dead-lettered as ``own_conflict``, one error naming them all
        and the producer (a forged or broken rollout service: the conflict alert fires)."""
        p = rows[0].payload
        ids = sorted({first_id, *(r.envelope.message_id for r in rows)})
        fields = {"policy": self.policy, "reason": "conflict", "step": p.step, "prompt_id": p.prompt_id,
                  "sample_index": p.sample_index, "message_ids": ids,
                  "producers": sorted({r.envelope.producer for r in rows}),
                  "weights_versions": sorted({r.envelope.weights_version for r in rows})}
        for r in rows:
            self.sub.refuse([r], "own_conflict", json.dumps(fields))
            totals["own_rejected:conflict"] += 1
        what = (f"was trained at step {trained_at}: one of them is forged (a holder of the rollout key), so a forged "
                "row may have been trained") if trained_at is not None else "neither is trained (failed closed)"
        log.error("own rollouts %s are different copies of step %s prompt %s sample %s from %s: %s", ", ".join(ids),
                  p.step, p.prompt_id, p.sample_index, "/".join(fields["producers"]), what,
                  extra={"fields": fields})

    def _drop_stale(self, stale: list[Received], totals: Counter) -> None:
        """Rollouts of a step already trained (they arrived late: a slow or restarted rollout service): the same
        content as the trained row is a duplicate, other content a conflict with it; one of a sample never
        trained is dead-lettered as ``own_late``."""
        copies = []
        for r in stale:
            p = r.payload
            trained = self.trained.get((p.step, p.prompt_id, p.sample_index))
            invalid = self._unknown(r)  # an impossible copy says nothing about the trained row: refused as such
            if invalid is not None:
                self._refuse(r, invalid, totals)
            elif trained is None:
                self._refuse(r, "late", totals)
            elif trained[1] == sample_digest(r):
                copies.append(r)
            else:
                self._conflict([r], trained[0], totals, trained_at=p.step)
        if copies:
            self.sub.ack(copies)
            totals["own_duplicate"] += len(copies)

    def _unknown(self, r: Received) -> str | None:
        """``unknown_version`` when the rollout claims weights its learner never published: a version newer than
        its newest, or the weights of a step it has not trained (step t is sampled with weights of t−1 at most)."""
        p = r.payload
        if self.newest_version is not None and r.envelope.weights_version > self.newest_version():
            return "unknown_version"
        if int(p.weights_step) >= int(p.step):
            return "unknown_version"
        return None

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
