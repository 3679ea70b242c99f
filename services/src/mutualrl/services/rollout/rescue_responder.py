"""The rollout service's half of SGT-R's rescue round under ``mutualrl up`` (learner/rescue_requests.py).

A thread beside the sampling loop reads its own learner's ``SampleRequest`` messages, samples them with the engine
at the policy's settings (the engine's lock keeps a request, a step's generation and a weights load apart), and
publishes the ``SampleResult``. A request for a step the learner has already finished is stale and skipped; one
over the bounds (prompts, samples, a prompt longer than the model's context) is answered with an error, which the
learner counts, rather than sampled.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Callable

from mutualrl.see import ExperienceExchange
from mutualrl.services.rollout.engine import RolloutEngine, SamplingSpec
from mutualrl.v1 import experience_pb2 as pb

MAX_PROMPTS, MAX_SAMPLES = 256, 64


class SampleResponder:
    """Answers this policy's rescue requests on its engine."""

    def __init__(self, policy: str, exchange: ExperienceExchange, engine: RolloutEngine, spec: SamplingSpec,
                 learner_step: Callable[[], int], max_context: int | None = None,
                 log: logging.Logger | logging.LoggerAdapter | None = None, consumer: str = "0"):
        self.policy, self.ex, self.engine, self.spec = policy, exchange, engine, spec
        self.learner_step, self.max_context = learner_step, max_context
        self.log = log or logging.getLogger(__name__)
        self.sub = exchange.subscribe(f"{policy}-rollout", ["sample_request"], [policy],
                                      consumer=f"{policy}-rollout-rescue-{consumer}")
        self.answered = 0

    def serve(self, stop: threading.Event, poll_ms: int = 500) -> threading.Thread:
        """Answer requests in a daemon thread until ``stop``."""
        def loop() -> None:
            while not stop.is_set():
                self.answer_pending(poll_ms)

        t = threading.Thread(target=loop, name=f"{self.policy}-rescue", daemon=True)
        t.start()
        return t

    def answer_pending(self, poll_ms: int = 0) -> int:
        """Answer the requests waiting now; how many were answered."""
        got = self.sub.poll(block_ms=poll_ms)
        done = 0
        for m in got:
            req = m.payload
            if int(req.step) < self.learner_step():  # the learner is past that step: nobody waits for it
                continue
            self.ex.publish(self._answer(req), self.policy)
            done += 1
        self.sub.ack(got)
        self.answered += done
        return done

    def _answer(self, req: pb.SampleRequest) -> pb.SampleResult:
        prompts = [list(p.token_ids) for p in req.prompts]
        res = pb.SampleResult(request_id=req.request_id, step=req.step)
        error = self._refusal(prompts, int(req.n))
        if error is None:
            try:
                groups = self.engine.generate(prompts, dataclasses.replace(self.spec, n=int(req.n),
                                                                           seed=int(req.seed)))
            except Exception as e:  # noqa: BLE001 - the learner is told, the service keeps serving
                error = f"generation failed: {type(e).__name__}: {e}"
            else:
                res.weights_version = self.engine.info().weights_version
                for g in groups:
                    res.groups.add().completions.extend(
                        pb.SampleResult.Completion(token_ids=s.token_ids, logprobs=s.logprobs,
                                                   finish_reason=s.finish_reason) for s in g)
        if error is not None:
            res.error = error
            self.log.warning("rescue request %s refused: %s", req.request_id, error)
        return res

    def _refusal(self, prompts: list[list[int]], n: int) -> str | None:
        if not prompts or len(prompts) > MAX_PROMPTS:
            return f"{len(prompts)} prompts (1 to {MAX_PROMPTS})"
        if not 1 <= n <= MAX_SAMPLES:
            return f"{n} samples a prompt (1 to {MAX_SAMPLES})"
        if any(not p for p in prompts):
            return "an empty prompt"
        longest = max(len(p) for p in prompts)
        if self.max_context and longest + self.spec.max_new_tokens > self.max_context:
            return f"a prompt of {longest} tokens leaves no room for {self.spec.max_new_tokens} new ones " \
                   f"in {self.max_context}"
        return None
