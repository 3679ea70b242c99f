"""The own-rollout intake under pipelined sampling (docs/algorithms.md §6): a rollout of step t sampled
with weights older than step t−1−k is refused as ``too_stale`` and acknowledged (consumed, not used);
within the bound it is admitted. Over a real in-process SEE exchange."""

import time
from collections import Counter

from transformers import PreTrainedTokenizerFast

from mutualrl.see import ExperienceExchange, InProcessBroker
from mutualrl.services.learner.own_experience import OwnIntake
from mutualrl.tasks import Problem
from mutualrl.v1 import experience_pb2 as pb

PROBLEM = Problem("1+1=", "2")


def _publish(ex, step: int, weights_step: int, index: int) -> None:
    rollout = pb.Rollout(prompt_id=PROBLEM.prompt_id, prompt_text=PROBLEM.prompt, completion_text="2",
                         prompt_token_ids=[1, 2], token_ids=[3], logprobs=[-0.5], reward=1.0, step=step,
                         sample_index=index, group_size=4, weights_step=weights_step)
    ex.publish(rollout, "a", weights_step)


def test_a_rollout_older_than_the_bound_is_refused_and_consumed(tokenizers):
    ex = ExperienceExchange(InProcessBroker(), "mutualrl:t")
    sub = ex.subscribe("a", ["rollout"], ["a"], consumer="a-learner")
    tok: PreTrainedTokenizerFast = next(iter(tokenizers.values()))
    intake = OwnIntake("a", sub, tok, context_limit=64, vocab_size=len(tok), max_lag=1)
    # step 5: the learner starts it with step 4's weights; k = 1 admits weights of steps 3 and 4
    for index, weights_step in enumerate([4, 3, 2, 0]):
        _publish(ex, 5, weights_step, index)
    totals: Counter = Counter()
    got = intake.collect(5, 4, time.monotonic() + 0.5, {PROBLEM.prompt_id: PROBLEM}, totals, lambda g: g)
    assert sorted(r.payload.weights_step for r in got) == [3, 4]
    assert totals["own_rejected:too_stale"] == 2
    # the refused ones were acknowledged; only the admitted ones wait, unacknowledged, for the step's update
    assert sub.poll() == []
    assert sorted(r.payload.weights_step for r in sub.reclaim(0)) == [3, 4]
