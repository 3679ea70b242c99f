"""A learner takes from its own rollout service only well-formed groups, over a real in-process SEE exchange:
a sample index beyond G is refused; two differing copies of a (prompt, sample) — forged first or not, whatever their
weights versions — both fail closed (dead-lettered as conflicts, an error naming both); a copy stamped with weights
never published is refused; a copy arriving after its step was trained is compared with the trained row; a
byte-identical repeat is acknowledged and counted; late and over-long rows are dead-lettered with their reasons and
the fields that decided them, and logged. Nothing refused is trained on, and nothing refused stays pending."""

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


def test_a_forged_first_copy_and_the_real_one_both_fail_closed_loudly(setup, caplog):
    ex, sub, intake = setup
    forged = ex.publish(rollout(index=0, tokens=(5, 5)), "a", 1)  # first: a forgery made with the service's key
    real = ex.publish(rollout(index=0, tokens=(3,)), "a", 1)  # the same sample and weights version, other content
    ex.publish(rollout(index=0, tokens=(4,)), "a", 1)  # a third copy of the conflicted sample
    ex.publish(rollout(index=1), "a", 1)
    with caplog.at_level(logging.WARNING, logger="mutualrl.learner.own"):
        got, totals = collect(intake, expected=2)
    assert [r.payload.sample_index for r in got] == [1]  # neither copy of sample 0 is trained
    assert totals["own_rejected:conflict"] == 3 and totals["own_duplicate"] == 0
    assert dead_letters(ex) == ["own_conflict"] * 3
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and forged in errors[0].getMessage() and real in errors[0].getMessage()
    assert errors[0].fields["producers"] == ["a"] and errors[0].fields["reason"] == "conflict"


def test_a_resample_with_newer_weights_is_a_conflict_and_a_byte_identical_redelivery_a_duplicate(setup):
    ex, sub, intake = setup
    ex.publish(rollout(index=0, tokens=(3,)), "a", 1)
    ex.publish(rollout(index=0, tokens=(3,)), "a", 1)  # republished: byte for byte the same sample
    ex.publish(rollout(index=1, tokens=(3,)), "a", 1)
    ex.publish(rollout(index=1, tokens=(4,)), "a", 2)  # sampled again with newer weights: other content
    got, totals = collect(intake, expected=2)
    assert [r.payload.sample_index for r in got] == [0]  # trained once
    assert totals["own_duplicate"] == 1 and totals["own_rejected:conflict"] == 2
    assert dead_letters(ex) == ["own_conflict"] * 2


def test_a_copy_stamped_with_weights_never_published_is_refused(setup):
    ex, sub, intake = setup
    intake.newest_version = lambda: 2
    ex.publish(rollout(index=0), "a", 99)  # a version the learner never published
    bad = rollout(index=1)
    bad.weights_step = 3  # the weights of the step being trained: not published yet
    ex.publish(bad, "a", 2)
    ex.publish(rollout(index=2), "a", 2)
    got, totals = collect(intake, expected=3)
    assert [r.payload.sample_index for r in got] == [2]
    assert totals["own_rejected:unknown_version"] == 2
    assert dead_letters(ex) == ["own_unknown_version"] * 2
    detail = [e.data.split(b"\x00", 4)[3] for e in ex.broker.recent(dead_letter_stream(NS), 100)]
    assert any(b'"newest_published": 2' in d for d in detail), detail


def test_a_copy_that_arrives_after_its_step_was_trained_is_compared_with_the_trained_row(setup, caplog):
    ex, sub, intake = setup
    ex.publish(rollout(index=0, tokens=(5, 5)), "a", 1)  # a forgery that won the race: trained at step 3
    got, _ = collect(intake, expected=1)
    assert len(got) == 1
    ex.publish(rollout(index=0, tokens=(3,)), "a", 1)  # the real copy, after step 3 was trained
    ex.publish(rollout(index=0, tokens=(5, 5)), "a", 1)  # the trained one, redelivered
    ex.publish(rollout(index=0, tokens=(6,)), "a", 99)  # an impossible copy: no evidence against the trained row
    ex.publish(rollout(step=4, index=0), "a", 1)
    intake.newest_version = lambda: 1
    with caplog.at_level(logging.WARNING, logger="mutualrl.learner.own"):
        got, totals = collect(intake, expected=1, step=4)
    assert [r.payload.step for r in got] == [4]
    assert totals["own_rejected:conflict"] == 1 and totals["own_duplicate"] == 1
    assert sorted(dead_letters(ex)) == ["own_conflict", "own_unknown_version"]
    assert any(r.levelno == logging.ERROR and "may have been trained" in r.getMessage() for r in caplog.records)


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
