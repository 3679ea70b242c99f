"""A learner takes from its own rollout service only well-formed groups, over a real in-process SEE exchange:
a sample index beyond G is refused; the first valid row of a (prompt, sample) wins; a copy with the same weights
version but other content is dead-lettered as a conflict and logged as an error; a repeat, or a sample drawn again
with newer weights after a restart, is acknowledged and counted; late and over-long rows are dead-lettered with
their reasons and logged. Nothing refused is trained on, and nothing refused stays pending."""

from __future__ import annotations

import logging
import time
from collections import Counter

import pytest

from mutualrl.see import ExperienceExchange, InProcessBroker
from mutualrl.see.exchange import dead_letter_stream
from mutualrl.services.learner.own_experience import OwnIntake
from mutualrl.tasks import Problem
from mutualrl.v1 import experience_pb2 as pb

PROBLEM = Problem("1+1=", "2")
NS = "mutualrl:t"
G = 4


def rollout(step: int = 3, index: int = 0, tokens=(3,), group_size: int = G) -> pb.Rollout:
    return pb.Rollout(prompt_id=PROBLEM.prompt_id, prompt_text=PROBLEM.prompt, completion_text="2",
                      prompt_token_ids=[1, 2], token_ids=list(tokens), logprobs=[-0.5] * len(tokens), reward=1.0,
                      step=step, sample_index=index, group_size=group_size)


@pytest.fixture
def setup(tokenizers):
    ex = ExperienceExchange(InProcessBroker(), NS)
    sub = ex.subscribe("a", ["rollout"], ["a"], consumer="a-learner")
    tok = next(iter(tokenizers.values()))
    intake = OwnIntake("a", sub, tok, context_limit=16, vocab_size=len(tok), group_size=G)
    return ex, sub, intake


def collect(intake, expected: int = G, step: int = 3):
    totals: Counter = Counter()
    got = intake.collect(step, expected, time.monotonic() + 0.3, {PROBLEM.prompt_id: PROBLEM}, totals, lambda g: g)
    return got, totals


def dead_letters(ex) -> list[str]:
    return [e.data.split(b"\x00", 1)[0].decode() for e in ex.broker.recent(dead_letter_stream(NS), 100)]


def test_a_sample_index_beyond_the_group_or_a_wrong_group_size_is_refused(setup):
    ex, sub, intake = setup
    for i in range(G):
        ex.publish(rollout(index=i), "a", 1)
    ex.publish(rollout(index=G), "a", 1)  # a fifth sample of a group of four
    ex.publish(rollout(index=1, group_size=5), "a", 1)
    got, totals = collect(intake, expected=G + 2)
    assert sorted(r.payload.sample_index for r in got) == list(range(G))
    assert totals["own_rejected:bad_group"] == 2
    assert dead_letters(ex).count("own_bad_group") == 2


def test_the_first_valid_row_wins_and_a_conflicting_copy_is_dead_lettered_and_logged(setup, caplog):
    ex, sub, intake = setup
    ex.publish(rollout(index=0, tokens=(5, 5)), "a", 1)  # first (a forgery made with the service's key, say)
    ex.publish(rollout(index=0, tokens=(3,)), "a", 1)  # the same sample and weights version, other content
    with caplog.at_level(logging.WARNING, logger="mutualrl.learner.own"):
        got, totals = collect(intake, expected=2)
    assert [list(r.payload.token_ids) for r in got] == [[5, 5]]
    assert totals["own_rejected:conflict"] == 1 and totals["own_duplicate"] == 0
    assert dead_letters(ex) == ["own_conflict"]
    assert any(r.levelno == logging.ERROR and "conflicts" in r.getMessage() for r in caplog.records)


def test_a_repeat_or_a_resample_with_newer_weights_is_a_duplicate_not_a_conflict(setup):
    ex, sub, intake = setup
    ex.publish(rollout(index=0, tokens=(3,)), "a", 1)
    ex.publish(rollout(index=0, tokens=(3,)), "a", 1)  # republished after a restart: the same sample
    ex.publish(rollout(index=0, tokens=(4,)), "a", 2)  # sampled again after a restart, with newer weights
    got, totals = collect(intake, expected=3)
    assert len(got) == 1 and totals["own_duplicate"] == 2 and not totals["own_rejected:conflict"]
    assert dead_letters(ex) == []


def test_late_and_over_long_rows_are_dead_lettered_with_their_reasons_and_nothing_stays_pending(setup, caplog):
    ex, sub, intake = setup
    ex.publish(rollout(step=1, index=0), "a", 1)  # a step already trained
    ex.publish(rollout(index=1, tokens=tuple(range(4, 20))), "a", 1)  # over the context limit
    ex.publish(rollout(index=2), "a", 1)
    with caplog.at_level(logging.WARNING, logger="mutualrl.learner.own"):
        got, totals = collect(intake, expected=3)
    assert [r.payload.sample_index for r in got] == [2]
    assert totals["own_rejected:late"] == 1 and totals["own_rejected:too_long"] == 1
    assert sorted(dead_letters(ex)) == ["own_late", "own_too_long"]
    assert sum("refused" in r.getMessage() for r in caplog.records) == 2
    assert sub.poll() == [] and [r.payload.sample_index for r in sub.reclaim(0)] == [2]  # only the used one waits
