"""`mutualrl run` with resume points: a run stopped after its last step, 3 (its newest resume point: step 2; none
is written at the last step), goes on from step 3 when started again, and ends with the numbers of the same run
left uninterrupted."""

import json
import math
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import mutualrl.app.embedded as embedded
import mutualrl.runtime.disk_budget as disk_budget
from mutualrl.app.resume_point import RESUME_FILE, config_fingerprint, save_resume_point
from mutualrl.config import ConfigError, load_config
from mutualrl.runtime.disk_budget import NotEnoughDisk

ROOT = Path(__file__).resolve().parents[2]
SETS = ["budget.steps=3", "budget.prompts_per_step=8", "eval.every=2", "eval.size=16", "sharing.mode=sgt",
        "checkpoint.resume_every=2"]


class _Stop(Exception):
    """Stands for the process ending (a session's end, a spot instance taken back) after a step."""


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _trained(out: Path) -> dict[tuple[str, int], dict]:
    recs = [r for r in _records(out) if r.get("phase") != "warm_start"]
    keys = [(r["policy"], r["step"]) for r in recs]
    assert len(keys) == len(set(keys)), f"a step written twice: {keys}"
    return {(r["policy"], r["step"]): r for r in recs}


def test_a_stopped_run_resumes_from_its_resume_point_and_ends_as_an_uninterrupted_one(tmp_path, monkeypatch):
    cfg = lambda: load_config(ROOT / "examples" / "demo.yaml", SETS)  # noqa: E731 — the run mutates its config
    whole = embedded.run_embedded(cfg(), tmp_path / "whole")
    assert not (tmp_path / "whole" / RESUME_FILE).exists()  # removed once the run finished
    assert "resumed_after_step" not in whole

    out = tmp_path / "stopped"
    after_step = embedded._Resumption.after_step

    def stop_after_3(self, step, last_eval):
        after_step(self, step, last_eval)
        if step == 3:
            raise _Stop

    monkeypatch.setattr(embedded._Resumption, "after_step", stop_after_3)
    with pytest.raises(_Stop):
        embedded.run_embedded(cfg(), out)
    assert (out / RESUME_FILE).is_file() and not (out / "summary.json").exists()
    assert {s for _, s in _trained(out)} == {1, 2, 3}  # step 3 was written, and is past the resume point
    monkeypatch.setattr(embedded._Resumption, "after_step", after_step)

    # started again on a disk without room for what it will write, it is refused before anything is evaluated or
    # trained, and its directory keeps what it needs to resume: the records up to its resume point (step 3's, past
    # it, are dropped as a resumed run drops them) and the resume point
    with monkeypatch.context() as full:
        full.setattr(disk_budget.shutil, "disk_usage", lambda path: SimpleNamespace(total=1, used=1, free=0))
        with pytest.raises(NotEnoughDisk) as refused:
            embedded.run_embedded(cfg(), out)
    assert {s for _, s in _trained(out)} == {1, 2} and (out / RESUME_FILE).is_file()
    # what it said it needs (resumed: one copy of every learner's state) is what the whole run's final checkpoints
    # took, to within the tokenizers and the files' own overhead
    written = sum(f.stat().st_size for f in (tmp_path / "whole" / "checkpoints").rglob("*") if f.is_file())
    assert 0.8 < refused.value.need / written < 1.25, (refused.value.need, written)

    import torch

    before = torch.load(out / RESUME_FILE, weights_only=False)["elapsed_s"]
    restore, held = embedded._Resumption.restore, []

    def restore_and_look(self, runtimes, followers):
        restore(self, runtimes, followers)
        held.append(dict(self.point.learners))

    monkeypatch.setattr(embedded._Resumption, "restore", restore_and_look)
    resumed = embedded.run_embedded(cfg(), out)
    assert resumed["resumed_after_step"] == 2
    assert held == [{}]  # the loaded learner states are let go once restored, not held for the rest of the run
    # the run's wall time spans its invocations: the seconds before the resume point are kept, so the whole run
    # took longer than its RL steps (it took rl_s + loading + evaluations), and longer than this invocation alone
    assert before > 0 and resumed["elapsed_s"] > before and resumed["elapsed_s"] >= resumed["rl_s"]
    assert not (out / RESUME_FILE).exists()
    a, b = _trained(tmp_path / "whole"), _trained(out)
    assert a.keys() == b.keys() == {(p, s) for p in ("llama-char", "qwen-bpe") for s in range(1, 4)}
    for key in a:  # the same prompts, samples and updates: the same numbers, to float rounding
        for field in ("reward_mean", "loss", "rollouts", "rescue_count"):
            x, y = a[key][field], b[key][field]
            assert math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-6), (key, field, x, y)
        if "eval_accuracy" in a[key]:
            assert a[key]["eval_accuracy"] == b[key]["eval_accuracy"], key
    for name, pol in whole["policies"].items():
        got = resumed["policies"][name]
        assert got["final_accuracy"] == pol["final_accuracy"] and got["rollouts"] == pol["rollouts"]
        assert got["warm_start_accuracy"] == pol["warm_start_accuracy"]
    for name in ("llama-char", "qwen-bpe"):  # each evaluation logged once: steps 0, 2 and 3
        evals = [json.loads(line)["step"] for line in (out / "evals" / f"{name}.jsonl").read_text().splitlines()]
        assert evals == [0, 2, 3], (name, evals)


def test_a_resume_point_of_another_config_or_damaged_is_refused_in_one_line(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    save_resume_point(out, config_fingerprint(load_config(ROOT / "examples" / "demo.yaml", SETS)), 2, {}, {}, 0.0)
    with pytest.raises(ConfigError, match="resume point of another config"):
        embedded.run_embedded(load_config(ROOT / "examples" / "demo.yaml", [*SETS, "algorithm.epsilon=1e-5"]), out)
    # how it is checkpointed or tracked is not part of what it trains
    with pytest.raises(ConfigError, match=r"holds policies \[\]"):
        embedded.run_embedded(load_config(ROOT / "examples" / "demo.yaml", [*SETS, "checkpoint.resume_every=1"]), out)
    (out / RESUME_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="cannot be read"):
        embedded.run_embedded(load_config(ROOT / "examples" / "demo.yaml", SETS), out)
    assert not (out / "metrics.jsonl").exists()  # refused before anything was written


def test_settings_the_run_settles_after_loading_do_not_refuse_its_own_resume_point(tmp_path):
    """Loading a pretrained model fills ``optim.lr`` by its size into the run's config; the resume point is of
    the config as loaded, so the same config loaded again by a restarted run matches it."""
    out = tmp_path / "o"
    out.mkdir()
    cfg = load_config(ROOT / "examples" / "demo.yaml", SETS)
    resumption = embedded._Resumption(cfg, out, time.monotonic())
    for p in cfg.policies:  # as runtime.policy_setup does for a loaded model whose config sets no lr
        p.optim.lr = 1e-5
    resumption.after_step(2, {})
    # the fingerprint matched: what is refused is the (empty) set of policies this bare resume point holds
    with pytest.raises(ConfigError, match=r"holds policies \[\]"):
        embedded._Resumption(load_config(ROOT / "examples" / "demo.yaml", SETS), out, time.monotonic())


def test_a_setting_at_its_default_is_not_part_of_the_fingerprint():
    """A release that adds a setting (at a default keeping the old behaviour) resumes the runs of the one before:
    the fingerprint is of what the run was told. Giving a setting its default value is the same run; changing
    it is another."""
    cfg = load_config(ROOT / "examples" / "demo.yaml", SETS)
    name = cfg.policies[0].name
    same = load_config(ROOT / "examples" / "demo.yaml", [*SETS, f"policies.{name}.optim.state_dtype=float32"])
    other = load_config(ROOT / "examples" / "demo.yaml", [*SETS, f"policies.{name}.optim.state_dtype=bfloat16"])
    assert config_fingerprint(same) == config_fingerprint(cfg) != config_fingerprint(other)
    assert "state_dtype" not in json.dumps(cfg.model_dump(mode="json", exclude_defaults=True))
