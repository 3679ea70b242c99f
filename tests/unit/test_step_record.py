"""A step's record: typed fields, the extra fields by name, and its line of metrics.jsonl read back as it was."""

import json

from mutualrl.services.learner import SampledStep, StepRecord
from mutualrl.services.learner.modes import record_keys
from mutualrl.services.learner.step_record import STEP_FIELDS


def _trained() -> StepRecord:
    return StepRecord(step=3, policy="a", reward_mean=0.25, loss=-0.1, grad_norm=1.5, updates=2, own_rollouts=8,
                      peer_rejected={"stale": 1}, stage_seconds={"train": 2.0}, tokens=40,
                      extra={"sgt_nll": 0.7, "approx_kl": 0.01}, train_s=2.5)


def test_a_trained_record_writes_every_field_and_its_extras_and_reads_back_the_same():
    rec = _trained()
    rec.sampled(SampledStep(rollouts=24, shared_out=2, gen_s=1.5))
    rec.wall_time, rec.eval_accuracy = 100.0, 0.5
    line = rec.to_dict()
    assert line["step_s"] == 4.0  # sampling and training seconds
    assert "train_s" not in line and "edges" not in line and "skipped" not in line
    assert line["sgt_nll"] == 0.7 and line["approx_kl"] == 0.01 and line["rollouts"] == 24
    assert set(line) == (STEP_FIELDS - {"skipped", "edges"}) | {"sgt_nll", "approx_kl"}
    back = StepRecord.from_dict(json.loads(json.dumps(line)))
    assert back.to_dict() == line
    assert back.extra == {"sgt_nll": 0.7, "approx_kl": 0.01} and back.peer_rejected == {"stale": 1}


def test_fields_the_loop_did_not_fill_are_left_out():
    rec = _trained()
    rec.sampled(None)  # a service: no rollout side in the process
    line = rec.to_dict()
    assert line["step_s"] == 2.5
    assert not {"rollouts", "shared_out", "gen_s", "eval_accuracy", "wall_time"} & set(line)


def test_a_skipped_step_writes_only_what_it_has():
    rec = StepRecord(4, "a", skipped=True, train_s=30.0)
    rec.sampled(None)
    rec.wall_time = 5.0
    assert rec.to_dict() == {"step": 4, "policy": "a", "skipped": True, "step_s": 30.0, "wall_time": 5.0}
    assert StepRecord.from_dict(rec.to_dict()).skipped


def test_no_mode_field_shadows_a_typed_field():
    # a mode's field would silently lose to the typed one of the same name in the file
    assert not set(record_keys()) & STEP_FIELDS
