"""The per-prompt bank of peers' verified successes (SGT under bounded peers): bounded in prompts,
successes per prompt and age, released when the prompt comes up. Over real SEE messages."""

import pytest

from mutualrl.see import ExperienceExchange, InProcessBroker
from mutualrl.services.learner.success_bank import SuccessBank
from mutualrl.v1 import experience_pb2 as pb


def _successes(items):
    """Real Received messages: one VerifiedSuccess per (prompt_id, step)."""
    ex = ExperienceExchange(InProcessBroker(), "mutualrl:bank")
    sub = ex.subscribe("b", ["verified_success"], ["a"], consumer="b-learner")
    for pid, step in items:
        ex.publish(pb.VerifiedSuccess(prompt_id=pid, prompt_text=pid, completion_text="2", step=step), "a", step)
    return sub.poll()


def test_released_when_its_prompt_comes_up_and_not_before():
    bank = SuccessBank(prompts=8, per_prompt=2, max_age=10)
    bank.deposit(_successes([("p", 3), ("q", 4)]), step=5)
    assert bank.withdraw({"r"}, step=6) == [] and len(bank) == 2
    got = bank.withdraw({"p", "r"}, step=6)
    assert [m.payload.prompt_id for m in got] == ["p"] and len(bank) == 1
    assert bank.counts == {"banked": 2, "released": 1}


def test_bounded_in_age():
    bank = SuccessBank(prompts=8, per_prompt=2, max_age=5)
    bank.deposit(_successes([("old", 1), ("p", 10)]), step=7)  # 6 steps old at deposit: dropped
    assert len(bank) == 1 and bank.counts["expired"] == 1
    assert bank.withdraw({"p"}, step=16) == [] and bank.counts["expired"] == 2  # 6 steps old at use


def test_bounded_in_size_the_oldest_prompt_and_oldest_success_go_first():
    bank = SuccessBank(prompts=2, per_prompt=2, max_age=100)
    bank.deposit(_successes([("p", 1), ("p", 2), ("p", 3)]), step=3)
    bank.deposit(_successes([("q", 3), ("r", 3)]), step=3)
    assert bank.counts["evicted"] == 1 + 2  # p's oldest success, then all of p (least recently deposited)
    assert bank.withdraw({"p"}, step=4) == []
    assert sorted(m.payload.prompt_id for m in bank.withdraw({"q", "r"}, step=4)) == ["q", "r"]


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="prompts >= 1"):
        SuccessBank(prompts=0, per_prompt=1, max_age=1)
