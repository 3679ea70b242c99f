"""Experiment tracking against the real things on loopback (docs/tracking.md): a 2-step demo run read back
with TensorBoard's own event reader and from a real `tensorboard` server's scalars endpoint; a real `mlflow
server` on SQLite holding the run's parent and one child per policy; W&B offline read back with its own
`wandb leet inspect`; and an MLflow server killed in the middle of a run, which finishes anyway."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from mlflow_server import MlflowServer, mlflow_binary  # tests/mlflow_server.py

from mutualrl.app.compare import CompareSpec, _nest_in_mlflow
from mutualrl.app.compare_analysis import tracking_links
from mutualrl.app.embedded import Reporter, run_embedded
from mutualrl.config import load_config
from mutualrl.see.server import free_port

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["budget.steps=2", "budget.prompts_per_step=4", "eval.every=1", "eval.size=16"]
POLICIES = ("llama-char", "qwen-bpe")


def _demo(*sets: str):
    return load_config(ROOT / "examples" / "demo.yaml", [*QUICK, *sets])


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _wait_http(url: str, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{url}: the server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer in {timeout} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.fixture
def mlflow_server(tmp_path):
    if not mlflow_binary().exists():
        if os.environ.get("CI"):
            pytest.fail(f"{mlflow_binary()} is missing: `make test` installs the MLflow server into .venv-mlflow")
        pytest.skip(f"no MLflow server at {mlflow_binary()} (`make test` installs it)")
    server = MlflowServer(tmp_path).start(nice=1)  # a priority of its own, which a test checks
    yield server.uri, server
    server.stop()


def test_a_two_step_run_reads_back_from_its_event_files_and_a_real_tensorboard_server(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    summary = run_embedded(_demo(), out)  # tensorboard is on by default
    records = [r for r in _records(out) if r.get("phase") != "warm_start"]
    for policy in POLICIES:
        acc = EventAccumulator(str(out / "tensorboard" / policy))
        acc.Reload()
        mine = [r for r in records if r["policy"] == policy]
        reward = acc.Scalars("train/reward_mean")
        assert [e.step for e in reward] == [1, 2]
        assert [e.value for e in reward] == pytest.approx([r["reward_mean"] for r in mine])
        assert [e.step for e in acc.Scalars("eval/accuracy")] == [0, 1, 2]  # the warm start, then every step
        assert acc.Scalars("by_rollouts/eval_accuracy")[-1].step == mine[-1]["rollouts"]
        tags = set(acc.Tags()["scalars"])
        assert {"train/loss", "train/kl", "train/clip_frac", "train/grad_norm", "time/train_s",
                "throughput/tokens_per_s", "sharing/rescues", "thl/residual", "final/final_accuracy"} <= tags
        assert "config/text_summary" in acc.Tags()["tensors"]  # the resolved config beside the curves
    assert summary["tracking"]["llama-char"]["tensorboard"]["dropped"] == 0

    port = free_port()
    tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(out / "tensorboard"),
                           "--host", "127.0.0.1", "--port", str(port), "--load_fast", "false"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_http(base + "/data/runs", 120, tb)
        deadline = time.monotonic() + 60
        while set(json.loads(urllib.request.urlopen(base + "/data/runs").read())) != set(POLICIES):
            assert time.monotonic() < deadline, "tensorboard did not list both policies"
            time.sleep(1)
        for policy in POLICIES:
            q = urllib.parse.urlencode({"run": policy, "tag": "train/reward_mean"})
            points = json.loads(urllib.request.urlopen(f"{base}/data/plugin/scalars/scalars?{q}").read())
            want = [r["reward_mean"] for r in records if r["policy"] == policy]
            assert [p[1] for p in points] == [1, 2] and [p[2] for p in points] == pytest.approx(want)
    finally:
        _stop(tb)


def test_the_local_mlflow_server_runs_in_the_callers_session_so_its_lower_priority_holds(mlflow_server):
    """A new session is a CPU group of its own under autogroup scheduling, where ``nice`` does nothing against
    the run beside it: the server keeps the caller's session, in a process group of its own (for ``stop``)."""
    _, server = mlflow_server
    pid = server.proc.pid
    assert os.getsid(pid) == os.getsid(0) and os.getpgid(pid) == pid != os.getpgid(0)
    assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 1)
    server.stop()
    assert server.proc.poll() is not None


def test_mlflow_holds_the_experiment_as_a_parent_run_and_each_policy_as_a_child(mlflow_server, tmp_path):
    from mlflow import MlflowClient

    uri, _ = mlflow_server
    out = tmp_path / "run"
    summary = run_embedded(_demo("tracking.backends=[jsonl,mlflow]", f"tracking.mlflow.tracking_uri={uri}",
                                 "tracking.tags.team=rl"), out)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("demo")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("mutualrl.role") == "experiment"]
    children = [r for r in runs if r.data.tags.get("mutualrl.role") == "policy"]
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.params["budget.steps"] == "2"
    assert parent.data.tags["seed"] == "0" and parent.data.tags["team"] == "rl"
    assert "config.yaml" in [a.path for a in client.list_artifacts(parent.info.run_id)]
    records = [r for r in _records(out) if r.get("phase") != "warm_start"]
    for child in children:
        policy = child.data.tags["policy"]
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id and child.info.status == "FINISHED"
        assert child.data.tags["sharing"] == "sgt" and child.data.tags["model"] in ("llama", "qwen2")
        assert child.data.tags["tokenizer"] in ("char", "bpe") and child.data.tags["mutualrl.version"]
        history = client.get_metric_history(child.info.run_id, "train/reward_mean")
        want = [r["reward_mean"] for r in records if r["policy"] == policy]
        history = sorted((m.step, m.value) for m in history)
        assert [h[0] for h in history] == [1, 2] and [h[1] for h in history] == pytest.approx(want)
        assert child.data.params["policies.0.name"] == "llama-char"
        final = summary["policies"][policy]["final_accuracy"]
        assert parent.data.metrics[f"{policy}/final/final_accuracy"] == pytest.approx(final)
    assert all(v["mlflow"]["dropped"] == 0 for v in summary["tracking"].values())


def test_a_compare_nests_its_runs_under_one_mlflow_run_and_the_report_links_it(mlflow_server, tmp_path):
    from mlflow import MlflowClient

    uri, _ = mlflow_server
    spec_file = tmp_path / "c.yaml"
    spec_file.write_text(f"name: tiny\nbaseline: a\nseeds: [0, 1]\npairs: {{p: {ROOT / 'examples' / 'demo.yaml'}}}\n"
                         "entries: {a: []}\n")
    spec = CompareSpec.load(spec_file)
    configs = [_demo("tracking.backends=[jsonl,tensorboard,mlflow]", f"tracking.mlflow.tracking_uri={uri}")
               for _ in range(2)]
    out = tmp_path / "cmp"
    _nest_in_mlflow(spec, out, configs)
    _nest_in_mlflow(spec, out, configs)  # a resumed compare finds its run again
    run_id = json.loads((out / "tracking.json").read_text())["mlflow_run_id"]
    assert all(c.tracking.mlflow.parent_run_id == run_id and c.tracking.mlflow.experiment == "tiny" for c in configs)
    client = MlflowClient(uri)
    assert len(client.search_runs([client.get_experiment_by_name("tiny").experiment_id])) == 1
    run_embedded(configs[0], out / "runs" / "a" / "p" / "seed0")
    nested = client.search_runs([client.get_experiment_by_name("tiny").experiment_id],
                                f"tags.`mlflow.parentRunId` = '{run_id}'")
    assert len(nested) == 1 and nested[0].data.tags["mutualrl.role"] == "experiment"
    links = tracking_links(out)
    assert links["mlflow_url"].startswith(uri) and run_id in links["mlflow_url"]
    assert links["tensorboard"].endswith(str(out / "runs"))


class _KillAtStep(Reporter):
    """Kills the tracking server once step ``at`` is done; keeps every warning."""

    def __init__(self, server: MlflowServer, at: int):
        self.server, self.at, self.warnings = server, at, []

    def step(self, step, total, records, last_eval):
        if step == self.at:
            self.server.stop()

    def warn(self, text):
        self.warnings.append(text)


def test_a_tracking_server_killed_mid_run_costs_points_not_the_run(mlflow_server, tmp_path, monkeypatch):
    monkeypatch.setattr("mutualrl.tracking.guard.PAUSE_S", (0.1, 0.2, 0.2))
    uri, server = mlflow_server
    out = tmp_path / "run"
    rep = _KillAtStep(server, 1)
    summary = run_embedded(_demo("budget.steps=3", "tracking.backends=[jsonl,tensorboard,mlflow]",
                                 f"tracking.mlflow.tracking_uri={uri}", "tracking.timeout_s=3"), out, rep)
    steps = {(r["policy"], r["step"]) for r in _records(out) if r.get("phase") != "warm_start"}
    assert steps == {(p, s) for p in POLICIES for s in (1, 2, 3)}  # metrics.jsonl is complete
    assert len(rep.warnings) == 1 and rep.warnings[0].startswith("tracking: mlflow"), rep.warnings
    for policy in POLICIES:
        assert summary["tracking"][policy]["mlflow"]["dropped"] > 0  # counted
        assert summary["tracking"][policy]["tensorboard"]["dropped"] == 0  # the other tracker is untouched
    assert summary["policies"]["llama-char"]["final_accuracy"] is not None


def test_wandb_offline_writes_a_run_its_own_tools_read(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    out = tmp_path / "run"
    run_embedded(_demo("tracking.backends=[jsonl,wandb]", "tracking.wandb.mode=offline"), out)
    runs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 2
    records = [r for r in _records(out) if r.get("phase") != "warm_start"]
    wandb_cli = Path(sys.executable).with_name("wandb")
    for d in runs:
        shown = subprocess.run([str(wandb_cli), "leet", "inspect", "--summary", "--json", str(d)],
                               capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr
        run = json.loads(shown.stdout)
        mine = [r for r in records if r["policy"] == run["name"]]
        assert run["state"] == "finished" and run["project"] == "mutualrl" and run["step"] == 2
        assert run["summary"]["train/reward_mean"] == pytest.approx(mine[-1]["reward_mean"])
        assert "final/final_accuracy" in run["summary"] and "edge/" in " ".join(run["summary"])
        assert run["config"]["budget.steps"] == 2 and run["config"]["tag.policy"] == run["name"]
        assert "sharing:sgt" in run["tags"]
    assert {json.loads(subprocess.run([str(wandb_cli), "leet", "inspect", "--summary", "--json", str(d)],
                                      capture_output=True, text=True, timeout=120).stdout)["name"]
            for d in runs} == set(POLICIES)


def _open_child(uri: str, policy: str, group: str, run_dir: str, q, opened=None) -> None:
    """One learner process opening its policy's MLflow run (what `mutualrl serve learner` does at start);
    with ``opened`` (a barrier), it then looks again once every learner has opened, as at its first flush."""
    from mutualrl.tracking.backend import RunInfo
    from mutualrl.tracking.mlflow_backend import MlflowBackend

    b = MlflowBackend(RunInfo("svc", policy, group, Path(run_dir), tags={"policy": policy}), uri, None)
    b.open()
    if opened is not None:
        opened.wait(timeout=60)
        b.settle_parent()
    q.put((policy, b.parent_id, b.run_id))


def test_a_learner_that_missed_an_earlier_parent_moves_its_run_under_it_and_deletes_its_own(mlflow_server,
                                                                                            tmp_path):
    """The one race the election at open leaves: another learner's parent, stamped earlier, reaches the
    server after this learner's check. At its first flush this learner follows it."""
    from mlflow import MlflowClient

    from mutualrl.tracking.backend import RunInfo
    from mutualrl.tracking.mlflow_backend import GROUP_TAG, ROLE_TAG, MlflowBackend

    uri, _ = mlflow_server
    b = MlflowBackend(RunInfo("race", "llama-char", "ns-race", tmp_path, tags={"policy": "llama-char"}), uri, None)
    b.open()
    client = MlflowClient(uri)
    mine = b.parent_id
    earlier = client.create_run(b.experiment_id, start_time=client.get_run(mine).info.start_time - 1000,
                                tags={GROUP_TAG: "ns-race", ROLE_TAG: "experiment"}).info.run_id
    b.log_many([(1, {"train/reward_mean": 0.5})])
    assert client.get_run(b.run_id).data.tags["mlflow.parentRunId"] == earlier
    assert client.get_run(mine).info.lifecycle_stage == "deleted"
    assert [r.info.run_id for r in client.search_runs([b.experiment_id], f"tags.`{ROLE_TAG}` = 'experiment'")] \
        == [earlier]
    b.finish({"final/final_accuracy": 0.25})
    parent = client.get_run(earlier)
    assert parent.data.metrics["llama-char/final/final_accuracy"] == 0.25 and parent.info.status == "FINISHED"
    assert client.get_metric_history(b.run_id, "train/reward_mean")[0].value == 0.5


def test_learners_in_separate_processes_share_one_parent_run_and_a_restarted_one_takes_its_run_up(mlflow_server,
                                                                                                   tmp_path):
    import multiprocessing as mp

    from mlflow import MlflowClient

    uri, _ = mlflow_server
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    all_open = ctx.Barrier(len(POLICIES))
    procs = [ctx.Process(target=_open_child, args=(uri, p, "ns-1", str(tmp_path), q, all_open)) for p in POLICIES]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    opened = {policy: (parent, run) for policy, parent, run in (q.get(timeout=5) for _ in POLICIES)}
    assert len({parent for parent, _ in opened.values()}) == 1  # one experiment run, whoever made it first
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("svc").experiment_id
    live = client.search_runs([exp], "tags.`mutualrl.role` = 'experiment'")
    assert [r.info.run_id for r in live] == [next(iter(opened.values()))[0]]
    # a learner restarted after a crash opens its policy's run again instead of a new one
    again = ctx.Process(target=_open_child, args=(uri, POLICIES[0], "ns-1", str(tmp_path), q))
    again.start()
    again.join(timeout=120)
    assert q.get(timeout=5)[1:] == opened[POLICIES[0]]
