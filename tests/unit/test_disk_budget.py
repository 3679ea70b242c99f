"""What a run writes to disk, estimated before it trains (mutualrl.runtime.disk_budget), against hand-counted bytes
and the real disk under the test's directory."""

import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mutualrl.config import ConfigError
from mutualrl.runtime.disk_budget import (
    SERVICE_REMEDY,
    NotEnoughDisk,
    check_room,
    free_bytes,
    learner_state_bytes,
    moment_bytes,
    parameter_bytes,
    run_disk_need,
    service_disk_need,
    size_text,
    weight_store_need,
)


def _model() -> torch.nn.Module:
    m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 4, bias=False))  # 8 + 8 parameters
    m[1].weight.requires_grad_(False)  # frozen: no moments
    return m


def test_state_counts_weights_and_two_moments_per_trained_parameter():
    # fp32: 16 weights × 4 bytes, and 8 trained × 2 moments × 4 bytes
    assert learner_state_bytes(_model()) == 16 * 4 + 8 * 2 * 4
    assert learner_state_bytes(_model(), moment_bytes=2) == 16 * 4 + 8 * 2 * 2  # optim.state_dtype: bfloat16
    assert learner_state_bytes(_model().to(torch.bfloat16)) == 16 * 2 + 8 * 2 * 2  # moments in the weights' dtype


def test_a_tied_parameter_is_counted_once():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    assert learner_state_bytes(torch.nn.ModuleList([emb, head])) == 40 * 12


def test_the_disk_need_is_one_copy_of_the_state_per_file_alive_at_once():
    state = 1000
    assert run_disk_need(state, resume_every=0, steps=20, resumed=False) == 1000  # the final checkpoints only
    assert run_disk_need(state, resume_every=2, steps=20, resumed=False) == 2000  # old and new resume point
    assert run_disk_need(state, resume_every=20, steps=20, resumed=False) == 1000  # none before the last step
    assert run_disk_need(state, resume_every=2, steps=20, resumed=True) == 1000  # one resume point is on disk


def test_a_learner_service_needs_two_copies_whatever_its_checkpoint_interval():
    # its state file is written at the last step too, and the final checkpoint beside it
    assert service_disk_need(1000, resumed=False) == 2000
    assert service_disk_need(1000, resumed=True) == 1000  # its state file is on disk already
    assert moment_bytes("bfloat16") == 2 and moment_bytes("float32") is None


def test_a_learner_service_refuses_a_disk_too_small_before_it_trains(tmp_path, monkeypatch):
    from mutualrl.runtime import disk_budget
    from mutualrl.services.learner.service import _check_disk

    pp = SimpleNamespace(config=SimpleNamespace(name="smol", optim=SimpleNamespace(state_dtype="bfloat16")),
                         arts=SimpleNamespace(model=_model()))
    state = 16 * 4 + 8 * 2 * 2
    _check_disk(tmp_path, pp, resumed=False)  # the real disk has room
    monkeypatch.setattr(disk_budget.shutil, "disk_usage", lambda path: SimpleNamespace(total=1, used=1, free=0))
    for resumed, copies in ((False, 2), (True, 1)):
        with pytest.raises(NotEnoughDisk) as err:
            _check_disk(tmp_path, pp, resumed=resumed)
        assert err.value.need == copies * state and err.value.free == 0
        # what to do for a service: its checkpoints cannot be switched off (they are how it resumes)
        assert "smol's learner" in str(err.value) and SERVICE_REMEDY in str(err.value)
        assert "resume_every" not in str(err.value)


def test_a_weights_version_is_the_parameters_once_and_the_store_keeps_two_beside_the_one_written():
    assert parameter_bytes(_model()) == 16 * 4  # frozen or not: every weight goes to the engine
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    assert parameter_bytes(torch.nn.ModuleList([emb, head])) == 40 * 4
    assert weight_store_need(100, keep=2, resumed=False) == 300
    assert weight_store_need(100, keep=2, resumed=True) == 100  # its kept versions are on disk already


ROOT = Path(__file__).resolve().parents[2]


def _full(monkeypatch):
    from mutualrl.runtime import disk_budget

    monkeypatch.setattr(disk_budget.shutil, "disk_usage", lambda path: SimpleNamespace(total=1, used=1, free=0))


def test_a_run_counts_the_weights_versions_it_writes_to_disk_for_engines(tmp_path, monkeypatch):
    from mutualrl.app.embedded import _check_disk
    from mutualrl.config import load_config
    from mutualrl.weights.store import WeightStore

    # in-process engines that do not sample the learner's own module (as beside a server engine, whose run keeps
    # every version in <out>/weights); a plain run keeps them in memory (no root)
    cfg = load_config(ROOT / "examples" / "demo.yaml", ["weights.share_in_process=false", "checkpoint.resume_every=0"])
    prepared = [SimpleNamespace(config=p, arts=SimpleNamespace(model=_model())) for p in cfg.policies]
    state, weights = 2 * (16 * 4 + 8 * 2 * 4), 2 * 16 * 4
    _full(monkeypatch)
    with pytest.raises(NotEnoughDisk) as on_disk:
        _check_disk(cfg, prepared, tmp_path, False, WeightStore(tmp_path / "weights"))
    assert on_disk.value.need == state + 3 * weights and "weights versions engines read" in str(on_disk.value)
    with pytest.raises(NotEnoughDisk) as in_memory:
        _check_disk(cfg, prepared, tmp_path, False, WeightStore())
    assert in_memory.value.need == state and "weights versions" not in str(in_memory.value)
    shared = cfg.model_copy(update={"weights": cfg.weights.model_copy(update={"share_in_process": True})})
    with pytest.raises(NotEnoughDisk) as one_module:  # sampled from the learner's module: no version is written
        _check_disk(shared, prepared, tmp_path, False, WeightStore(tmp_path / "weights"))
    assert one_module.value.need == state


def test_up_counts_each_learners_checkpoints_and_the_versions_it_publishes(tmp_path, monkeypatch):
    from mutualrl.app.launcher import Supervisor
    from mutualrl.config import load_config

    sup = Supervisor(load_config(ROOT / "examples" / "demo.yaml"), tmp_path)
    sup.state_bytes, sup.weights_bytes = {"a": 1200, "b": 600}, {"a": 400, "b": 200}
    sup.check_disk(weights=True)  # the real disk has room
    _full(monkeypatch)
    with pytest.raises(NotEnoughDisk) as fresh:
        sup.check_disk()  # while the policies load: the checkpoints only
    assert fresh.value.need == 2 * 1800 and "of a, b (" in str(fresh.value) and SERVICE_REMEDY in str(fresh.value)
    with pytest.raises(NotEnoughDisk) as with_versions:
        sup.check_disk(weights=True)
    assert with_versions.value.need == 2 * 1800 + 3 * 600
    (tmp_path / "services").mkdir()
    (tmp_path / "services" / "a.learner.state.pt").write_bytes(b"")  # a's learner resumes: one copy more of it
    with pytest.raises(NotEnoughDisk) as resumed:
        sup.check_disk(weights=True)
    assert resumed.value.need == 1200 + 400 + 2 * 600 + 3 * 200


def test_sizes_read_in_the_unit_that_shows_them():
    assert size_text(3 * 2**30) == "3.0 GiB"
    assert size_text(5 * 2**20) == "5.0 MiB"


def test_a_run_directory_that_does_not_exist_yet_is_measured_on_its_parent(tmp_path):
    assert free_bytes(tmp_path / "runs" / "a" / "seed0") == free_bytes(tmp_path) > 0


def test_a_disk_too_small_is_refused_with_what_is_needed_and_free(tmp_path):
    check_room(tmp_path, 1, "a byte")  # room: nothing raised
    need = free_bytes(tmp_path) + 2**40
    with pytest.raises(NotEnoughDisk) as err:
        check_room(tmp_path / "run", need, "the final checkpoints of 2 policies")
    e = err.value
    assert isinstance(e, ConfigError)  # the CLI prints it as one line, as it prints a bad config
    assert e.need == need and 0 < e.free < need
    assert str(tmp_path / "run") in str(e) and size_text(need) in str(e) and "checkpoint.resume_every: 0" in str(e)
    again = pickle.loads(pickle.dumps(e))  # from a `compare --jobs N` worker process
    assert (str(again), again.need, again.free) == (str(e), e.need, e.free)
