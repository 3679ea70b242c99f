"""The step record's sampling-entropy estimate (``own_sampled_nll``): the mean of −log π_behaviour over the own rows'
trained tokens, read from the log-probs the sampler returned; peer, rescue and masked tokens do not count."""

from __future__ import annotations

import math

import pytest

from mutualrl.services.learner.objective import OWN, PEER, RESCUE, Rows
from mutualrl.tracking.points import scalars


def _row(rows: Rows, logprobs: list[float], mask: list[float], kind: int) -> None:
    rows.add(prompt_token_ids=[1], token_ids=list(range(len(logprobs))), logprobs=logprobs, mask=mask, reward=0.0,
             prompt_id="p", source_policy="me" if kind == OWN else "peer", kind=kind, source_mean_logprob=0.0)


def test_the_estimate_averages_the_own_trained_tokens_only():
    rows = Rows()
    _row(rows, [math.log(0.5), math.log(0.25)], [1, 1], OWN)  # 0.693 and 1.386 nats
    _row(rows, [math.log(0.5), -9.0], [1, 0], OWN)  # the masked token (a pad, a cut stop string) is left out
    _row(rows, [-5.0, -5.0], [1, 1], PEER)  # another policy's tokens say nothing of this one's sampling
    _row(rows, [-7.0], [1], RESCUE)
    assert rows.own_sampled_nll() == pytest.approx((2 * math.log(2) + math.log(4)) / 3)


def test_no_own_token_gives_none_and_the_tracker_names_it_the_sampling_entropy():
    rows = Rows()
    _row(rows, [-1.0], [0], OWN)
    _row(rows, [-2.0], [1], PEER)
    assert rows.own_sampled_nll() is None
    assert scalars({"step": 1, "policy": "a", "own_sampled_nll": 0.75})["train/sampled_entropy"] == 0.75
