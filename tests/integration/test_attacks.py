"""Fault-and-attack cases on a learner's inputs (real learners, the SEE codec with a shared key):
an impersonating producer, forged own rewards, a rollout past the model's context, a poison pill
that keeps coming back, and a peer that lies on every claim."""

from __future__ import annotations

import copy

import torch
from test_learner_step import _own_all_fail, _setup

from mutualrl.see import ExperienceExchange, InProcessBroker, dead_letter_stream
from mutualrl.services.learner.reputation import PeerReputation
from mutualrl.tasks import Problem
from mutualrl.tasks.verifiers import ExactMatchVerifier
from mutualrl.v1 import experience_pb2 as pb


def test_a_foreign_producer_on_a_policys_own_stream_is_dead_lettered(arithmetic_task):
    """Signed with the run's key but naming another producer: an impersonation, never trained."""
    ex, _, pols = _setup(arithmetic_task, mode="none")
    arts, _, _, learner = pols["a"]
    problems = [Problem("12+34=", "46")]
    _own_all_fail(ex, arts, problems)
    tok = arts.tokenizer
    ids = tok("46", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    forged = ex.codec.wrap_encoded(pb.Rollout(prompt_id=problems[0].prompt_id, prompt_text=problems[0].prompt,
                                              prompt_token_ids=tok(problems[0].prompt)["input_ids"],
                                              token_ids=ids, logprobs=[-0.1] * len(ids), reward=1.0, step=1,
                                              sample_index=99, group_size=8), "mallory")[1]
    ex.broker.publish("mutualrl:it:rollout:a", forged)  # onto a's own stream
    rec = learner.train_step(1, problems)
    assert learner.own.counts["dead_letter:wrong_producer"] == 1
    assert len(learner.last_used["own"]) == 8 and rec.reward_mean == 0.0


def test_forged_own_rewards_are_rescored_and_bad_rows_refused(arithmetic_task):
    ex, _, pols = _setup(arithmetic_task, mode="none")
    arts, _, _, learner = pols["a"]
    learner.intake.verifier = ExactMatchVerifier()
    tok = arts.tokenizer
    p = Problem("12+34=", "46")
    prompt = tok(p.prompt)["input_ids"]
    wrong = tok("45", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    limit = arts.model.config.max_position_embeddings
    rows = [
        (wrong, 1.0, p.prompt_id),                         # a wrong answer claiming reward 1
        (wrong, 0.0, p.prompt_id),
        ([5] * limit, 0.0, p.prompt_id),                   # past the model's context
        ([10 ** 6], 0.0, p.prompt_id),                     # not a token of this vocabulary
        (wrong, 0.0, "not-this-steps-prompt"),
    ]
    for i, (ids, reward, pid) in enumerate(rows):
        ex.publish(pb.Rollout(prompt_id=pid, prompt_text=p.prompt, prompt_token_ids=prompt, token_ids=ids,
                              logprobs=[-0.5] * len(ids),
                              reward=reward, step=1, sample_index=i, group_size=8), "a")
    rec = learner.train_step(1, [p])  # no IndexError, no crash
    assert rec.reward_mean == 0.0  # the claimed success is trained on as the failure it is
    t = learner.totals
    assert t["own_rescored"] == 1
    assert t["own_rejected:too_long"] == 1
    assert t["own_rejected:bad_token"] == 1
    assert t["own_rejected:unknown_prompt"] == 1
    assert learner.own.pending() == 0  # refused ones are consumed, not re-delivered forever


def test_a_poison_pill_is_dead_lettered_after_max_deliveries():
    """A message whose processing kills the receiver comes back on every restart; after
    max_deliveries it goes to the dead-letter stream instead of crash-looping the service."""
    ex = ExperienceExchange(InProcessBroker(), "mutualrl:pp", keys=b"k" * 32)
    ex.publish(pb.Rollout(prompt_id="p", step=1, token_ids=[1], logprobs=[-1.0]), "a")
    sub = ex.subscribe("a", ["rollout"], ["a"], consumer="a-learner", max_deliveries=3)
    assert len(sub.poll()) == 1  # delivered; the receiver "crashes" before acking
    got = [len(sub.reclaim(0)) for _ in range(3)]  # three restarts, each re-adopting it
    assert got == [1, 1, 0]
    assert sub.counts["dead_letter:poison_pill"] == 1 and sub.pending() == 0
    assert ex.broker.length(dead_letter_stream("mutualrl:pp")) == 1


def test_a_lying_peer_is_quarantined_and_its_rows_never_reach_a_loss(arithmetic_task):
    ex, _, pols = _setup(arithmetic_task, mode="naive")
    a_arts, _, _, a_learner = pols["a"]
    a_learner.intake.verifier = ExactMatchVerifier()
    b_tok, b_fp = pols["b"][0].tokenizer, pols["b"][0].fingerprint
    problems = [Problem("12+34=", "46"), Problem("5+5=", "10")]
    quarantined_at = None
    for step in (1, 2, 3):
        _own_all_fail(ex, a_arts, problems, step=step)
        for p in problems:  # every claim false: wrong answers announced as successes
            ids = b_tok("7", add_special_tokens=False)["input_ids"] + [b_tok.eos_token_id]
            for i in range(4):
                ex.publish(pb.Rollout(prompt_id=p.prompt_id, prompt_text=p.prompt, completion_text="7", token_ids=ids,
                                      logprobs=[-0.5] * len(ids),
                                      reward=1.0, step=step, sample_index=i, group_size=4, finish_reason="stop",
                                      tokenizer_fingerprint=b_fp), "b")
        rec = a_learner.train_step(step, problems)
        if quarantined_at is None and rec.peers_quarantined:
            quarantined_at = step
            assert rec.reputation_events[0]["peer"] == "b"
            assert rec.peer_rows == 0
            assert rec.peer_rejected["quarantined"] == 8
    assert quarantined_at is not None and quarantined_at <= 3
    assert a_learner.totals["peer_quarantined"] == 1


def test_reputation_quarantines_liars_forgives_noise_and_releases_after_probation():
    rep = PeerReputation(window=3, threshold=0.5, min_claims=4, probation=2)
    assert rep.record_step(1, {"honest": 10, "liar": 10}, {"honest": 1, "liar": 10})[0].peer == "liar"
    assert rep.quarantined("liar") and not rep.quarantined("honest")
    assert rep.record_step(2, {"liar": 5}, {"liar": 0}) == []  # one clean step is not enough
    ev = rep.record_step(3, {"liar": 5}, {})
    assert [e.action for e in ev] == ["released"] and not rep.quarantined("liar")
    assert rep.record_step(4, {"few": 2}, {"few": 2}) == []  # below min_claims: not judged yet
    state = copy.deepcopy(rep.state_dict())
    again = PeerReputation(window=3, threshold=0.5, min_claims=4, probation=2)
    again.load_state_dict(state)
    assert again.failure_rate("few") == rep.failure_rate("few") == 1.0
    assert torch.tensor(again.failure_rate("honest")).isclose(torch.tensor(0.1))


def test_an_honest_peer_whose_rows_the_receiver_cannot_spell_is_never_quarantined(arithmetic_task):
    """The probe's false quarantine: a byte-level BPE peer samples characters the char-level receiver has no token
    for, so THL refuses every row (``thl_roundtrip``). That is a limit of the pair of tokenizers, not a false claim:
    the peer's reputation is untouched, however many steps it lasts."""
    ex, _, pols = _setup(arithmetic_task, mode="naive")
    a_arts, _, _, a_learner = pols["a"]
    a_learner.intake.verifier = ExactMatchVerifier()
    b_tok, b_fp = pols["b"][0].tokenizer, pols["b"][0].fingerprint
    problems = [Problem("12+34=", "46"), Problem("5+5=", "10")]
    for step in range(1, 6):
        _own_all_fail(ex, a_arts, problems, step=step)
        for p in problems:
            text = "4\u00e96"  # honest (a wrong answer claiming reward 0), with a character 'a' cannot spell
            ids = b_tok(text, add_special_tokens=False)["input_ids"] + [b_tok.eos_token_id]
            for i in range(4):
                ex.publish(pb.Rollout(prompt_id=p.prompt_id, prompt_text=p.prompt, completion_text=text, token_ids=ids,
                                      logprobs=[-0.5] * len(ids), reward=0.0, step=step, sample_index=i,
                                      group_size=4, finish_reason="stop", tokenizer_fingerprint=b_fp), "b")
        rec = a_learner.train_step(step, problems)
        assert rec.peer_rejected.get("thl_roundtrip") == 8, rec.peer_rejected
        assert rec.peers_quarantined == [] and not rec.reputation_events
    assert a_learner.totals["peer_quarantined"] == 0


def test_a_peer_row_of_an_earlier_step_is_refused_as_late_not_as_an_unknown_prompt(arithmetic_task):
    """Under bounded peers a row of step t−1 (within the lag) can arrive while the receiver trains step t: its
    prompt is step t−1's, which step t cannot re-verify. Its reason is `late`; `unknown_prompt` is kept for a
    prompt that never was."""
    ex, _, pols = _setup(arithmetic_task, mode="naive")
    a_arts, _, _, a_learner = pols["a"]
    b_tok, b_fp = pols["b"][0].tokenizer, pols["b"][0].fingerprint
    earlier, now = Problem("1+2=", "3"), [Problem("12+34=", "46")]
    _own_all_fail(ex, a_arts, now, step=2)
    ids = b_tok("3", add_special_tokens=False)["input_ids"] + [b_tok.eos_token_id]
    for step, pid in ((1, earlier.prompt_id), (2, "never-a-prompt")):
        ex.publish(pb.Rollout(prompt_id=pid, prompt_text=earlier.prompt, completion_text="3", token_ids=ids,
                              logprobs=[-0.5] * len(ids), reward=1.0, step=step, sample_index=0, group_size=4,
                              finish_reason="stop", tokenizer_fingerprint=b_fp), "b")
    rec = a_learner.train_step(2, now)
    assert rec.peer_rejected == {"late": 1, "unknown_prompt": 1}


def test_every_peer_refusal_is_dead_lettered_with_its_reason_and_logged(arithmetic_task, caplog):
    """A lying peer's false success, a claim whose ids do not spell its text and a malformed trace each reach the
    dead-letter stream as ``peer_<reason>`` with the fields that decided it, and a warning names each one; a
    message from outside the staleness window (routine under pipelining) is counted and summed in one line, not
    dead-lettered. Nothing refused is left pending."""
    import json
    import logging

    from mutualrl.tasks.verifiers import ExactMatchVerifier

    ex, _, pols = _setup(arithmetic_task, mode="sgt")
    problems = [Problem("12+34=", "46"), Problem("5+5=", "10")]
    a_arts, _, _, learner = pols["a"]
    learner.intake.verifier = ExactMatchVerifier()
    _own_all_fail(ex, a_arts, problems, step=3)
    b_tok, b_fp = pols["b"][0].tokenizer, pols["b"][0].fingerprint

    def success(p, text, ids=None, logprobs=None, step=3):
        ids = ids if ids is not None else b_tok(text, add_special_tokens=False)["input_ids"]
        return ex.publish(pb.VerifiedSuccess(prompt_id=p.prompt_id, prompt_text=p.prompt, completion_text=text,
                                             token_ids=ids, logprobs=logprobs if logprobs is not None else
                                             [-0.5] * len(ids), reward=1.0, step=step,
                                             tokenizer_fingerprint=b_fp), "b")

    true = success(problems[0], "46")
    lie = success(problems[1], "11")                                              # does not verify
    spelled = success(problems[1], "10", ids=b_tok("12", add_special_tokens=False)["input_ids"])  # ids say 12
    broken = success(problems[0], "46", logprobs=[-0.5] * 7)                      # 7 log-probs for fewer ids
    stale = success(problems[0], "46", step=1)                                    # two steps old: stale
    with caplog.at_level(logging.INFO, logger="mutualrl.learner.peer"):
        rec = learner.train_step(3, problems)
    assert rec.rescue_count == 1
    assert rec.peer_rejected == {"reverify_failed": 1, "text_mismatch": 1, "malformed": 1, "stale": 1}
    letters = {}
    for e in ex.broker.recent(dead_letter_stream("mutualrl:it"), 100):
        reason, _, _, detail, _ = e.data.split(b"\x00", 4)
        d = json.loads(detail)
        letters[d["message_id"]] = (reason.decode(), d)
    assert set(letters) == {lie, spelled, broken} and true not in letters  # used; the stale one only counted
    assert letters[lie][0] == "peer_reverify_failed" and letters[lie][1]["completion_text"] == "11"
    assert letters[spelled][0] == "peer_text_mismatch"
    assert letters[spelled][1]["claimed"] == "10" and letters[spelled][1]["decoded"] == "12"
    assert letters[broken][0] == "peer_malformed" and letters[broken][1]["logprobs"] == 7
    assert all(d["producer"] == "b" and d["kind"] == "verified_success" for _, d in letters.values())
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "dead-lettered" in r.getMessage()]
    assert sorted(r.fields["message_id"] for r in warned) == sorted([lie, spelled, broken])
    assert any("a false claim" in r.getMessage() for r in warned if r.fields["message_id"] == lie)
    routine = [r for r in caplog.records if r.levelno == logging.INFO and "not used" in r.getMessage()]
    assert len(routine) == 1 and routine[0].fields["routine_refusals"] == {"stale": 1}
    assert stale not in letters and learner.peer_sub.pending() == 0
