"""Zero-trust intake of peer experience: staleness bound, re-verification, THL conversion, budget.

A peer is never trusted blindly (docs/algorithms.md §3.2): a claimed success or reward is
re-scored by the receiver's own verifier, statistics are sanity-checked, and
text that the receiver's tokenizer cannot carry within the THL budget is
rejected. Every rejection is counted by reason; nothing is dropped silently: a refused message is kept with its
reason and the fields that decided it (``IntakeResult.refusals``), and the learner dead-letters and logs it once the
step's update has used the rest. Only the refusals ordinary pipelining makes every step (``ROUTINE_REFUSALS``) are
counted without a dead letter each.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from mutualrl.grpo import RescueItem
from mutualrl.models.policy import PromptStyle, encode_prompt
from mutualrl.see import Received
from mutualrl.tasks import Problem, Verifier
from mutualrl.thl import Converted, ThlBudget, convert, convert_batch

log = logging.getLogger("mutualrl.learner.peer")

ROUTINE_REFUSALS = frozenset({"stale", "late", "quarantined"})
"""Refusals that a healthy run makes every step — a peer's message from outside the staleness window, about an
earlier step's prompts, or rows of a quarantined peer (whose reputation events are logged on their own) — are
counted per edge and by reason (records, Prometheus) and summed in one log line per
step. Dead-lettered one by one they would flood the dead-letter stream and bury what it is for: refusals that say
something is wrong."""

TEXT_IN_DETAIL = 200
"""Characters of a refused message's text kept in its dead letter's detail (the whole message is in the record)."""


def _canonical_claim(payload) -> bool | None:
    """The producer's canonical flag when it sent one (THL then skips the re-encode)."""
    return payload.canonical if payload.HasField("canonical") else None


class TokenizerRegistry:
    """Tokenizers by vocabulary fingerprint, so a receiver can read a producer's token ids."""

    def __init__(self) -> None:
        self._by_fp: dict[str, PreTrainedTokenizerBase] = {}

    def register(self, fingerprint: str, tok: PreTrainedTokenizerBase) -> None:
        """Know a peer's tokenizer by its vocabulary fingerprint."""
        self._by_fp[fingerprint] = tok

    def get(self, fingerprint: str) -> PreTrainedTokenizerBase | None:
        """The tokenizer of a fingerprint, or None (its messages are refused as ``unknown_tokenizer``)."""
        return self._by_fp.get(fingerprint)


@dataclass
class PeerRow:
    """A peer's completion in the receiver's token space (a training row for naive/prp/hacpo).

    ``token_ids`` end with the receiver's EOS when the peer stopped on EOS, but
    the terminal EOS is outside the probability contract (docs/algorithms.md §2.10): its
    ``mask`` is 0 and ``source_mean_logprob`` excludes the source's EOS. An EOS-only
    completion maps to the receiver's EOS, which then carries the whole contract.
    """

    prompt_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]  # source log-probs transported onto the receiver's tokens (THL)
    mask: list[float]  # 1 = token is in an aligned THL group (and is not the terminal EOS)
    reward: float  # the receiver's own verifier's score
    source_policy: str
    source_mean_logprob: float  # ℓ̄_src in the source's own tokenisation
    sample_index: int
    group_size: int
    message_id: str


@dataclass
class PeerStats:
    """One peer's ``AdvantageStats`` for one prompt."""

    producer: str
    count: int
    mean: float
    std: float
    success_rate: float


@dataclass(frozen=True)
class PeerRefusal:
    """One peer message the intake will not use: its reason and the fields that decided it."""
    message: Received
    reason: str
    detail: dict


def dead_letter(sub, refusal: PeerRefusal, policy: str) -> None:
    """One refused peer message to the dead-letter stream (``peer_<reason>`` with its deciding fields) and a warning
    naming it; a false claim (a success that does not verify, ids that do not spell the claimed text) also says that
    it counts against the peer's reputation."""
    r, d = refusal.reason, refusal.detail
    sub.refuse([refusal.message], f"peer_{r}", json.dumps(d))
    false_claim = r in ("reverify_failed", "text_mismatch")
    log.warning("peer %s %s from %s refused (%s): dead-lettered%s", d["kind"], d["message_id"], d["producer"], r,
                "; a false claim, held against the peer's reputation" if false_claim else "",
                extra={"fields": {"policy": policy, "reason": r, **d}})


def log_routine_refusals(policy: str, step: int, rejected: Counter) -> None:
    """One line a step for the peer messages a healthy run leaves unused (``ROUTINE_REFUSALS``): counted, not
    dead-lettered."""
    routine = {k: v for k, v in rejected.items() if k in ROUTINE_REFUSALS}
    if routine:
        log.info("step %s: %s peer message(s) not used (%s)", step, sum(routine.values()),
                 ", ".join(f"{k} {v}" for k, v in sorted(routine.items())),
                 extra={"fields": {"policy": policy, "step": step, "routine_refusals": routine}})


@dataclass
class IntakeResult:
    """What one step's peer experience became: admitted rows, rescues, and rejections by reason."""
    rescues: list[RescueItem] = field(default_factory=list)
    rows: list[PeerRow] = field(default_factory=list)
    stats: dict[str, list[PeerStats]] = field(default_factory=dict)  # prompt_id -> one per peer
    peer_rewards: dict[str, list[float]] = field(default_factory=dict)  # producer -> re-verified rewards this step
    residuals: list[float] = field(default_factory=list)  # unaligned fraction of each accepted message
    logprob_residuals: list[float] = field(default_factory=list)
    length_ratios: list[float] = field(default_factory=list)
    non_canonical: int = 0
    # alignment health per source policy (every conversion, accepted or not): the dashboards'
    # per-tokenizer-pair view, since a learner's receiver tokenizer is fixed
    by_source: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    rejected: Counter = field(default_factory=Counter)
    rescored: int = 0  # peer rows whose claimed reward our verifier corrected (used with our score)
    claims: Counter = field(default_factory=Counter)  # producer -> checked claims this step (for reputation)
    failures: Counter = field(default_factory=Counter)  # producer -> claims that failed a check
    used: list[Received] = field(default_factory=list)  # everything consumed (accepted or rejected), to ack
    step_lags: list[int] = field(default_factory=list)  # own step − the message's step, of every one admitted
    # per source policy (a sharing edge into this learner): messages offered, refused as stale, refused by THL
    per_source: dict[str, Counter] = field(default_factory=dict)
    refusals: list[PeerRefusal] = field(default_factory=list)  # to dead-letter (all but ROUTINE_REFUSALS)

    def refuse(self, m: Received, reason: str, **fields) -> None:
        """Count a refusal by reason and, unless it is routine, keep the message with its deciding fields."""
        self.rejected[reason] += 1
        if reason in ROUTINE_REFUSALS:
            return
        p = m.payload
        self.refusals.append(PeerRefusal(m, reason, {
            "kind": m.kind, "producer": m.envelope.producer, "message_id": m.envelope.message_id,
            "step": int(p.step), "prompt_id": p.prompt_id, "weights_version": int(m.envelope.weights_version),
            **fields}))

    def count(self, source: str, what: str) -> None:
        """Count one event of a sharing edge (``offered``, ``stale``, ``thl_rejected``)."""
        self.per_source.setdefault(source, Counter())[what] += 1

    def residual_summary(self) -> dict[str, float]:
        """The step's THL residuals: means over the converted messages, for the record."""
        def mean(xs: list[float]) -> float:
            return sum(xs) / len(xs) if xs else 0.0

        return {
            "thl_residual": mean(self.residuals),
            "thl_residual_max": max(self.residuals, default=0.0),
            "thl_logprob_residual": mean(self.logprob_residuals),
            "thl_length_ratio": mean(self.length_ratios) if self.length_ratios else 1.0,
            "thl_non_canonical": self.non_canonical,
            "thl_by_source": {
                src: {"messages": len(v["unaligned"]), "unaligned_mean": mean(v["unaligned"]),
                      "logprob_residual_mean": mean(v["logprob"]),
                      "length_ratio_mean": mean(v["length"]) if v["length"] else 1.0,
                      "roundtrip_failures": int(sum(v["roundtrip_failed"]))}
                for src, v in self.by_source.items()
            },
        }


@dataclass
class PeerIntake:
    """Admits peer experience: re-verifies claimed successes, checks staleness, retokenises through THL."""

    tokenizer: PreTrainedTokenizerBase
    verifier: Verifier
    tokenizers: TokenizerRegistry
    budget: ThlBudget
    max_step_lag: int = 1
    prompt_style: PromptStyle | None = None
    placement: str = "spread"
    _prompt_cache: dict[str, list[int]] = field(default_factory=dict, init=False)

    def _prompt_ids(self, problem: Problem) -> list[int]:
        """The prompt re-rendered with the receiver's own template (THL step 1)."""
        if problem.prompt not in self._prompt_cache:
            self._prompt_cache[problem.prompt] = encode_prompt(self.tokenizer, problem.prompt, self.prompt_style)
        return self._prompt_cache[problem.prompt]

    def _admit(self, m: Received, step: int, problems: dict[str, Problem], out: IntakeResult,
               max_lag: int | None = None) -> Problem | None:
        """Checks every kind shares: staleness (``max_lag`` steps, default ``max_step_lag``), a prompt of this
        step, the same prompt text."""
        out.used.append(m)
        p = m.payload
        out.count(m.envelope.producer, "offered")
        if step - p.step > (self.max_step_lag if max_lag is None else max_lag) or p.step > step:
            out.refuse(m, "stale")
            out.count(m.envelope.producer, "stale")
            return None
        problem = problems.get(p.prompt_id)
        if problem is None:
            # a row of an earlier step (within the lag) is about that step's prompts, which this step cannot
            # re-verify: it came too late to be used, it does not name a prompt that never existed
            reason = "late" if p.step < step else "unknown_prompt"
            out.refuse(m, reason, receiver_step=step)
            if reason == "late":
                out.count(m.envelope.producer, "stale")
            return None
        if hasattr(p, "prompt_text") and problem.prompt != p.prompt_text:
            out.refuse(m, "prompt_mismatch", prompt_text=p.prompt_text[:TEXT_IN_DETAIL],
                       expected=problem.prompt[:TEXT_IN_DETAIL])
            return None
        out.step_lags.append(step - p.step)
        return problem

    def _convert(self, source_tok: PreTrainedTokenizerBase, messages: list[Received],
                 with_logprobs: bool) -> list[Converted]:
        """One batched THL conversion for messages from one source vocabulary."""
        return convert_batch(
            source_tok, self.tokenizer, [list(m.payload.token_ids) for m in messages],
            [list(m.payload.logprobs) for m in messages] if with_logprobs else None,
            placement=self.placement, source_canonical=[_canonical_claim(m.payload) for m in messages],
            # type: ignore[arg-type]
        )

    def _usable(self, out: IntakeResult, conv: Converted, m: Received) -> bool:
        """The conversion reproduces the text the peer claimed and is within the THL budget
        (its residual is recorded); otherwise the rejection is counted by reason. Only a false claim (``text_mismatch``)
        counts against the peer's reputation; a THL rejection does not."""
        source, claimed_text = m.envelope.producer, m.payload.completion_text
        health = out.by_source.setdefault(source,
                                          {"unaligned": [], "logprob": [], "length": [], "roundtrip_failed": []})
        health["unaligned"].append(conv.residual.unaligned_fraction)
        health["logprob"].append(conv.residual.logprob_residual)
        health["length"].append(conv.residual.length_ratio)
        health["roundtrip_failed"].append(0.0 if conv.residual.roundtrip_ok else 1.0)
        if conv.text != claimed_text:  # the peer's own ids do not spell the text it claims: a false claim
            out.refuse(m, "text_mismatch", claimed=claimed_text[:TEXT_IN_DETAIL], decoded=conv.text[:TEXT_IN_DETAIL])
            out.failures[source] += 1
            return False
        reason = self._record(out, conv)
        if reason:
            # the receiver cannot carry this text over (a character its vocabulary cannot spell, a residual over
            # the budget): a limit of the pair of tokenizers, never held against the peer's reputation
            r = conv.residual
            out.refuse(m, reason, unaligned_fraction=r.unaligned_fraction, logprob_residual=r.logprob_residual,
                       length_ratio=r.length_ratio, roundtrip_ok=r.roundtrip_ok,
                       max_unaligned=self.budget.max_unaligned)
            out.count(source, "thl_rejected")
            return False
        return True

    def _record(self, out: IntakeResult, conv: Converted) -> str | None:
        reason = self.budget.rejection(conv.residual)
        if reason:
            return f"thl_{reason}"
        out.residuals.append(conv.residual.unaligned_fraction)
        out.logprob_residuals.append(conv.residual.logprob_residual)
        out.length_ratios.append(conv.residual.length_ratio)
        out.non_canonical += int(conv.residual.non_canonical)
        return None

    # ---- SGT ------------------------------------------------------------
    def verified_successes(self, messages: list[Received], step: int, problems: dict[str, Problem],
                           out: IntakeResult | None = None, max_lag: int | None = None) -> IntakeResult:
        """Turn peers' ``VerifiedSuccess`` messages for this step into rescue candidates
        (re-verified by the receiver, then THL-converted in one batch per source vocabulary); ``max_lag``: how
        old a success may be (a banked one: the bank's age bound)."""
        out = out or IntakeResult()
        by_source: dict[str, list[tuple[Received, Problem]]] = defaultdict(list)
        text_only: list[tuple[Received, Problem]] = []
        for m in messages:
            problem = self._admit(m, step, problems, out, max_lag)
            if problem is None:
                continue
            vs = m.payload
            out.claims[m.envelope.producer] += 1
            if self.verifier.score(problem, vs.completion_text) <= 0:  # a success we cannot confirm
                out.refuse(m, "reverify_failed", completion_text=vs.completion_text[:TEXT_IN_DETAIL])
                out.failures[m.envelope.producer] += 1
                continue
            if len(vs.logprobs) and len(vs.logprobs) != len(vs.token_ids):
                out.refuse(m, "malformed", tokens=len(vs.token_ids), logprobs=len(vs.logprobs))
                continue
            if self.tokenizers.get(vs.tokenizer_fingerprint) is not None and len(vs.token_ids):
                by_source[vs.tokenizer_fingerprint].append((m, problem))
            else:
                text_only.append((m, problem))  # text is all SGT needs; the residual covers the receiver side
        converted: list[tuple[Received, Problem, Converted]] = []
        for fp, items in by_source.items():
            src_tok = self.tokenizers.get(fp)
            lps = [list(m.payload.logprobs) for m, _ in items]
            convs = self._convert(src_tok, [m for m, _ in items], with_logprobs=all(lps))  # type: ignore[arg-type]
            converted += [(m, p, c) for (m, p), c in zip(items, convs)]
        for m, p in text_only:
            converted.append((m, p, convert(None, self.tokenizer, text=m.payload.completion_text)))
        for m, problem, conv in converted:
            vs = m.payload
            if not self._usable(out, conv, m):
                continue
            if not conv.target_ids:
                out.refuse(m, "empty")
                continue
            out.rescues.append(
                RescueItem(
                    prompt_id=vs.prompt_id,
                    prompt_token_ids=self._prompt_ids(problem),
                    token_ids=conv.target_ids + [self.tokenizer.eos_token_id],
                    source_policy=m.envelope.producer,
                    message_id=m.envelope.message_id,
                    text=vs.completion_text,
                )
            )
        return out

    # ---- naive / PRP / HACPO -------------------------------------------
    def rollouts(self, messages: list[Received], step: int, problems: dict[str, Problem],
                 out: IntakeResult | None = None) -> IntakeResult:
        """Peers' ``Rollout`` messages as rows in the receiver's token space (batched THL).

        Rewards are re-scored by the receiver's verifier (a disagreement is counted as
        re-scored — the row is used with the receiver's score — and as a failed claim of the peer); traces whose ids and
        log-probs disagree in length are ``malformed``; conversions over the THL
        budget are rejected by reason.
        """
        out = out or IntakeResult()
        by_source: dict[str, list[tuple[Received, Problem, float]]] = defaultdict(list)
        for m in messages:
            problem = self._admit(m, step, problems, out)
            if problem is None:
                continue
            r = m.payload
            if len(r.token_ids) != len(r.logprobs) or not all(math.isfinite(x) for x in r.logprobs):
                out.refuse(m, "malformed", tokens=len(r.token_ids), logprobs=len(r.logprobs),
                           finite=all(math.isfinite(x) for x in r.logprobs))
                continue
            if self.tokenizers.get(r.tokenizer_fingerprint) is None:
                out.refuse(m, "unknown_tokenizer", tokenizer_fingerprint=r.tokenizer_fingerprint)
                continue
            score = float(self.verifier.score(problem, r.completion_text))
            out.claims[m.envelope.producer] += 1
            if score != r.reward:
                out.rescored += 1  # the row is used with our score: re-scored, not rejected
                out.failures[m.envelope.producer] += 1  # ... but a wrong claim counts against the peer
            by_source[r.tokenizer_fingerprint].append((m, problem, score))
        eos = self.tokenizer.eos_token_id
        for fp, items in by_source.items():
            src_tok = self.tokenizers.get(fp)
            assert src_tok is not None
            convs = self._convert(src_tok, [m for m, _, _ in items], with_logprobs=True)
            for (m, problem, score), conv in zip(items, convs):
                r = m.payload
                if not self._usable(out, conv, m):
                    continue
                stopped = r.finish_reason == "stop"
                ids = list(conv.target_ids)
                lps = list(conv.target_logprobs or [0.0] * len(ids))
                mask = [float(x) for x in conv.target_mask]
                src_mean = conv.source_mean_logprob
                if not ids:
                    if not stopped:
                        out.refuse(m, "empty", finish_reason=r.finish_reason)
                        continue
                    # EOS-only completion: the receiver's EOS carries the source EOS's log-prob
                    ids, lps, mask, src_mean = [eos], [float(r.logprobs[-1])], [1.0], float(r.logprobs[-1])
                elif stopped:
                    ids, lps, mask = ids + [eos], lps + [float(r.logprobs[-1])], mask + [0.0]
                out.rows.append(
                    PeerRow(
                        prompt_id=r.prompt_id,
                        prompt_token_ids=self._prompt_ids(problem),
                        token_ids=ids,
                        logprobs=lps,
                        mask=mask,
                        reward=score,
                        source_policy=m.envelope.producer,
                        source_mean_logprob=float(src_mean if src_mean is not None else 0.0),
                        sample_index=int(r.sample_index),
                        group_size=int(r.group_size),
                        message_id=m.envelope.message_id,
                    )
                )
                out.peer_rewards.setdefault(m.envelope.producer, []).append(score)
        return out

    # ---- XGRPO ----------------------------------------------------------
    def advantage_stats(self, messages: list[Received], step: int, problems: dict[str, Problem],
                        out: IntakeResult | None = None) -> IntakeResult:
        """Peers' ``AdvantageStats``: sanity-checked (count ≥ 1, finite, std ≥ 0, rate in [0, 1])."""
        out = out or IntakeResult()
        for m in messages:
            if self._admit(m, step, problems, out) is None:
                continue
            a = m.payload
            ok = a.count >= 1 and all(math.isfinite(x) for x in (a.mean, a.std,
                a.success_rate)) and a.std >= 0 and 0 <= a.success_rate <= 1
            if not ok:
                out.refuse(m, "invalid_stats", count=int(a.count), mean=repr(a.mean), std=repr(a.std),
                           success_rate=repr(a.success_rate))
                continue
            peers = out.stats.setdefault(a.prompt_id, [])
            if any(s.producer == m.envelope.producer for s in peers):
                out.refuse(m, "duplicate_stats")
                continue
            peers.append(PeerStats(m.envelope.producer, int(a.count), float(a.mean), float(a.std),
                                   float(a.success_rate)))
        return out
