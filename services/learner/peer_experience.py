"""Zero-trust intake of peer experience: staleness bound, re-verification, THL conversion, budget.

A peer is never trusted blindly (design.md): a claimed success is re-scored by
the receiver's own verifier, and text that the receiver's tokenizer cannot carry
within the THL budget is rejected. Every rejection is counted by reason.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from mutualrl.grpo import RescueItem
from mutualrl.models.policy import encode_prompt
from mutualrl.see import Received
from mutualrl.tasks import Problem, Verifier
from mutualrl.thl import ThlBudget, convert


class TokenizerRegistry:
    """Tokenizers by vocabulary fingerprint, so a receiver can read a producer's token ids."""

    def __init__(self) -> None:
        self._by_fp: dict[str, PreTrainedTokenizerBase] = {}

    def register(self, fingerprint: str, tok: PreTrainedTokenizerBase) -> None:
        self._by_fp[fingerprint] = tok

    def get(self, fingerprint: str) -> PreTrainedTokenizerBase | None:
        return self._by_fp.get(fingerprint)


@dataclass
class IntakeResult:
    rescues: list[RescueItem] = field(default_factory=list)
    residuals: list[float] = field(default_factory=list)  # unaligned fraction of each accepted message
    logprob_residuals: list[float] = field(default_factory=list)
    rejected: Counter = field(default_factory=Counter)
    used: list[Received] = field(default_factory=list)  # everything consumed (accepted or rejected), to ack


class PeerIntake:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        verifier: Verifier,
        tokenizers: TokenizerRegistry,
        budget: ThlBudget,
        max_step_lag: int = 1,
        chat_template: bool | None = None,
    ):
        self.tok = tokenizer
        self.verifier = verifier
        self.tokenizers = tokenizers
        self.budget = budget
        self.max_step_lag = max_step_lag
        self.chat_template = chat_template

    def verified_successes(self, messages: list[Received], step: int, problems: dict[str, Problem]) -> IntakeResult:
        """Turn peers' ``VerifiedSuccess`` messages for this step into rescue candidates."""
        out = IntakeResult()
        for m in messages:
            out.used.append(m)
            vs = m.payload
            if step - vs.step > self.max_step_lag:
                out.rejected["stale"] += 1
                continue
            problem = problems.get(vs.prompt_id)
            if problem is None:
                out.rejected["unknown_prompt"] += 1
                continue
            if problem.prompt != vs.prompt_text:
                out.rejected["prompt_mismatch"] += 1
                continue
            if self.verifier.score(problem, vs.completion_text) <= 0:
                out.rejected["reverify_failed"] += 1  # the peer claimed a success we cannot confirm
                continue
            source_tok = self.tokenizers.get(vs.tokenizer_fingerprint)
            try:
                if source_tok is not None and len(vs.token_ids):
                    conv = convert(source_tok, self.tok, source_ids=list(vs.token_ids), source_logprobs=list(vs.logprobs) or None)
                    if conv.text != vs.completion_text:
                        out.rejected["text_mismatch"] += 1
                        continue
                else:
                    conv = convert(None, self.tok, text=vs.completion_text)
            except ValueError:
                out.rejected["malformed"] += 1
                continue
            reason = self.budget.rejection(conv.residual)
            if reason:
                out.rejected[f"thl_{reason}"] += 1
                continue
            if not conv.target_ids:
                out.rejected["empty"] += 1
                continue
            out.residuals.append(conv.residual.unaligned_fraction)
            out.logprob_residuals.append(conv.residual.logprob_residual)
            out.rescues.append(
                RescueItem(
                    prompt_id=vs.prompt_id,
                    prompt_ids=encode_prompt(self.tok, problem.prompt, self.chat_template),
                    completion_ids=conv.target_ids + [self.tok.eos_token_id],
                    source_policy=m.envelope.producer,
                    message_id=m.envelope.message_id,
                )
            )
        return out
