"""SGT-R's rescue samples under ``mutualrl up``: the learner asks its own rollout service over SEE.

The learner and its engine are separate services, so the second round of a step (hinted_rescue.py) cannot call the
engine. It publishes a signed ``SampleRequest`` on its own stream and waits for the ``SampleResult`` its rollout
service publishes (rollout/rescue_responder.py): no new network path, the same identities and ACLs as every other
message. An answer that does not come before the deadline, or that does not fit the request, raises
:class:`RescueUnavailable`: the step trains without the round, and says so.
"""

from __future__ import annotations

import time
import uuid

from mutualrl.models.generation import Sample
from mutualrl.see import ExperienceExchange
from mutualrl.v1 import experience_pb2 as pb


class RescueUnavailable(RuntimeError):
    """No usable rescue samples this step; ``reason`` is a short code (timeout, malformed, refused)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class ExchangeSampler:
    """``sample(prompts, n, seed, step)`` answered by the policy's rollout service (a SampleFn)."""

    def __init__(self, policy: str, exchange: ExperienceExchange, vocab_size: int, deadline_s: float = 600.0,
                 poll_ms: int = 500):
        self.policy, self.ex, self.vocab_size = policy, exchange, vocab_size
        self.deadline_s, self.poll_ms = deadline_s, poll_ms
        self.sub = exchange.subscribe(policy, ["sample_result"], [policy], consumer=f"{policy}-learner-rescue")

    def __call__(self, prompts: list[list[int]], n: int, seed: int, step: int = 0) -> list[list[Sample]]:
        """Ask for ``n`` samples of each prompt and wait for the answer (RescueUnavailable past the deadline)."""
        request_id = f"{self.policy}:{step}:{uuid.uuid4().hex[:12]}"
        req = pb.SampleRequest(request_id=request_id, step=step, n=n, seed=seed,
                               prompts=[pb.SampleRequest.PromptIds(token_ids=p) for p in prompts])
        self.ex.publish(req, self.policy)
        deadline = time.monotonic() + self.deadline_s
        while time.monotonic() < deadline:
            got = self.sub.poll(block_ms=self.poll_ms)
            self.sub.ack(got)  # answers to earlier requests (a restarted step's) are dropped with it
            for m in got:
                if m.payload.request_id == request_id:
                    return self._groups(m.payload, len(prompts), n)
        raise RescueUnavailable("timeout", f"policy {self.policy}: no answer from its rollout service to the rescue "
                                           f"request of step {step} within {self.deadline_s:.0f} s")

    def _groups(self, res: pb.SampleResult, prompts: int, n: int) -> list[list[Sample]]:
        """The answer's completions, checked against the request (n per prompt, one log-prob per token, ids in the
        vocabulary)."""
        if res.error:
            raise RescueUnavailable("refused", f"policy {self.policy}: its rollout service could not sample: "
                                               f"{res.error}")
        if len(res.groups) != prompts or any(len(g.completions) != n for g in res.groups):
            raise RescueUnavailable("malformed", f"policy {self.policy}: asked {prompts} x {n} rescue samples, "
                                                 f"got {[len(g.completions) for g in res.groups]}")
        out = []
        for g in res.groups:
            group = []
            for c in g.completions:
                ids = list(c.token_ids)
                if len(c.logprobs) != len(ids) or any(not 0 <= t < self.vocab_size for t in ids):
                    raise RescueUnavailable("malformed", f"policy {self.policy}: a rescue sample of {len(ids)} "
                                                         f"tokens has {len(c.logprobs)} log-probs or ids outside "
                                                         f"the vocabulary")
                group.append(Sample(ids, list(c.logprobs), c.finish_reason or "length"))
            out.append(group)
        return out
