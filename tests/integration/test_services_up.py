"""`mutualrl up` over real processes and sockets: Redis, per policy a rollout service and a
learner service, the prompt distributor; metrics scraped from every service while it runs;
and the faults the services must survive (kill -9 of a learner or a rollout server, SIGTERM)."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import redis
import torch

ROOT = Path(__file__).resolve().parents[2]
BASE = ["budget.steps={steps}", "budget.prompts_per_step=16", "eval.every=100", "eval.size=32", "sharing.mode=sgt",
        "launcher.peer_deadline_s=10"]


def _start(out: Path, steps: int, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "mutualrl.app.cli", "up", str(ROOT / "examples" / "demo.yaml"), "--out", str(out)]
    for s in [b.format(steps=steps) for b in BASE] + list(extra):
        cmd += ["--set", s]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _health(url: str) -> dict:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=3) as r:
            return json.loads(r.read())
    except OSError:
        return {}


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _wait_for_step(out: Path, service: str, step: int, what: str) -> dict:
    """Wait until ``service``'s /healthz reports ``step`` or later; the run's services table."""
    svcs = _services(out)
    _wait(lambda: _health(svcs[service]["ops"]).get("step", 0) >= step, 300, what)
    return svcs


def _services(out: Path) -> dict:
    return _wait(lambda: json.loads((out / "services.json").read_text()) if (out / "services.json").is_file() else None,
                 300, "services.json")["services"]


def _finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    output, _ = proc.communicate(timeout=timeout)
    return output


def _ledgers(out: Path, policy: str) -> tuple[dict, dict]:
    state = torch.load(out / "services" / f"{policy}.learner.state.pt", weights_only=False)
    published: dict[int, list[str]] = {}
    for line in (out / "services" / f"{policy}.rollout.ledger.jsonl").read_text().splitlines():
        e = json.loads(line)
        published.setdefault(int(e["step"]), []).extend(e["rollouts"])
    return state["ledger"], published


def test_two_policies_three_steps_over_processes(tmp_path):
    out = tmp_path / "run"
    proc = _start(out, 4)
    try:
        svcs = _services(out)
        assert set(svcs) == {"llama-char.rollout", "llama-char.learner", "qwen-bpe.rollout", "qwen-bpe.learner"}
        # the run's Redis takes no anonymous writer, and every message is signed with a run key
        info = json.loads((out / "services.json").read_text())
        anon = redis.Redis.from_url(info["redis"], socket_timeout=5)
        with pytest.raises((redis.exceptions.AuthenticationError, redis.exceptions.ResponseError),
                           match="NOAUTH|NOPERM|authenticated"):
            anon.xadd(f"{info['namespace']}:rollout:llama-char", {"data": b"forged"})
        anon.close()
        assert "hmac_key_env: MUTUALRL_RUN_HMAC_KEY" in (out / "config.yaml").read_text()
        _wait(lambda: all(_health(s["ops"]).get("step", 0) >= 2 for n, s in svcs.items() if s["role"] == "learner"),
              300, "learners at step 2")
        texts = {n: urllib.request.urlopen(s["ops"] + "/metrics", timeout=5).read().decode() for n, s in svcs.items()}
        for name, text in texts.items():
            for series in ("mutualrl_step{", "mutualrl_staleness_steps{", "mutualrl_see_stream_length"):
                assert series in text, name
            if name.endswith("rollout"):
                assert "mutualrl_rollouts_total{" in text
                assert "mutualrl_shared_out_total{" in text
                assert "mutualrl_weights_version{" in text
            else:
                assert "mutualrl_rollouts_consumed_total{" in text
                assert 'mutualrl_learner_stage_peak_resident_bytes{policy=' in text and 'stage="train"' in text
                assert "mutualrl_shared_in_total{" in text
                assert "mutualrl_thl_unaligned_ratio{" in text
                # each learner's tracker (TensorBoard by default) counts what it drops, from 0
                assert 'mutualrl_tracking_dropped_points_total{backend="tensorboard",policy=' in text
        status = subprocess.run([sys.executable, "-m", "mutualrl.app.cli", "status", str(out)], capture_output=True,
                                text=True, timeout=60)
        assert status.returncode == 0 and status.stdout.count(" ok ") >= 4, status.stdout
        output = _finish(proc)
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-3000:]
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("phase") != "warm_start"]
    assert {(r["policy"], r["step"]) for r in steps} == {(p, s) for p in ("llama-char", "qwen-bpe")
                                                          for s in range(1, 5)}
    for name in ("llama-char", "qwen-bpe"):
        mine = [r for r in steps if r["policy"] == name]
        assert [r["weights_version"] for r in mine] == [1, 2, 3, 4]
        assert sum(r["shared_in"] for r in mine) > 0 and sum(r["shared_out"] for r in mine) > 0  # both directions
        ledger = (out / "services" / f"{name}.rollout.ledger.jsonl").read_text().splitlines()
        rollout_versions = [json.loads(l)["weights_version"] for l in ledger]
        assert rollout_versions == [0, 1, 2, 3]  # each step sampled with the previous step's weights
        assert (out / "checkpoints" / name / "config.json").is_file()
    assert (out / "summary.json").is_file() and (out / "curves.png").is_file()
    # each learner logged its own policy into the run's one TensorBoard directory
    assert all(list((out / "tensorboard" / name).glob("events.out.tfevents.*")) for name in ("llama-char", "qwen-bpe"))
    # the run is over: its services no longer answer, and status says they finished (not that they are down)
    status = subprocess.run([sys.executable, "-m", "mutualrl.app.cli", "status", str(out)], capture_output=True,
                            text=True, timeout=60)
    assert status.returncode == 0 and status.stdout.count("finished") >= 4 and " down " not in status.stdout, \
        status.stdout
    summary = json.loads((out / "summary.json").read_text())["policies"]
    # the same summary as `mutualrl run`: rollouts counted, rejections by reason
    for name in ("llama-char", "qwen-bpe"):
        assert summary[name]["rollouts"] == 4 * 16 * 8 and isinstance(summary[name]["peer_rejections"], dict)
    # what `up` checks the disk for, one copy of each learner's state, is what each learner wrote twice: its state
    # file and its final checkpoint (to within the ledger, the records and the tokenizer)
    from transformers import AutoModelForCausalLM

    from mutualrl.runtime.disk_budget import learner_state_bytes

    for name in ("llama-char", "qwen-bpe"):
        copy = learner_state_bytes(AutoModelForCausalLM.from_pretrained(out / "checkpoints" / name))
        final = sum(f.stat().st_size for f in (out / "checkpoints" / name).rglob("*") if f.is_file())
        state_file = (out / "services" / f"{name}.learner.state.pt").stat().st_size
        assert 0.8 < copy / final < 1.25 and 0.8 < copy / state_file < 1.25, (name, copy, final, state_file)


def test_up_refuses_a_disk_without_room_before_any_service_starts(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from mutualrl.app.launcher import run_services
    from mutualrl.config import load_config
    from mutualrl.runtime import disk_budget

    cfg = load_config(ROOT / "examples" / "demo.yaml", [b.format(steps=2) for b in BASE])
    out = tmp_path / "run"
    monkeypatch.setattr(disk_budget.shutil, "disk_usage", lambda path: SimpleNamespace(total=1, used=1, free=0))
    with pytest.raises(disk_budget.NotEnoughDisk) as refused:
        run_services(cfg, out, echo=lambda line: None)
    # refused once the first policy was loaded: two copies of its learner's state (state file and final checkpoint)
    assert "learner state files and final checkpoints of llama-char (" in str(refused.value)
    assert "state.size" in str(refused.value) and refused.value.need > 0
    # nothing started: no Redis, no service, no record
    assert not (out / "services.json").exists() and not (out / "logs").exists()
    assert not (out / "metrics.jsonl").exists()


def test_killed_learner_is_restarted_and_resumes_without_losing_or_double_counting(tmp_path):
    out = tmp_path / "run"
    proc = _start(out, 6)
    try:
        _wait_for_step(out, "llama-char.learner", 2, "learner step 2")
        pid = int((out / "services" / "llama-char.learner.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        output = _finish(proc)
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-3000:]
    # MWRA's local plan is printed and followed: a CPU host shares its cores between the policies
    assert "[up] plan (cpu" in output and "llama-char.learner: cpu" in output
    plan = json.loads((out / "plan.json").read_text())
    assert plan["services"]["llama-char.learner"]["MUTUALRL_TORCH_THREADS"] >= "1"
    assert "llama-char.learner exited with -9; restarting" in output
    assert "resumed" in (out / "logs" / "llama-char.learner.log").read_text()
    ledger, published = _ledgers(out, "llama-char")
    assert sorted(ledger) == list(range(1, 7))
    used = [mid for s in sorted(ledger) for mid in ledger[s]["own"]]
    assert len(used) == len(set(used)) == 6 * 16 * 8  # nothing counted twice
    for s in range(1, 7):  # nothing lost: every step trained on exactly what its rollouts published
        assert set(ledger[s]["own"]) == set(published[s])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policies"]["llama-char"]["restarts"]["llama-char.learner"] == 1


def test_killed_rollout_server_learner_waits_its_deadline_then_the_run_completes(tmp_path):
    out = tmp_path / "run"
    proc = _start(out, 5, "launcher.rollout_deadline_s=4")
    try:
        _wait_for_step(out, "qwen-bpe.rollout", 2, "rollout step 2")
        os.kill(int((out / "services" / "qwen-bpe.rollout.pid").read_text()), signal.SIGKILL)
        output = _finish(proc)
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-3000:]
    assert "qwen-bpe.rollout exited with -9; restarting" in output
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"] for r in records if r["policy"] == "qwen-bpe" and r.get("phase") != "warm_start"}
    assert steps == set(range(1, 6))


def test_sigterm_stops_every_service(tmp_path):
    out = tmp_path / "run"
    proc = _start(out, 50)
    try:
        svcs = _wait_for_step(out, "llama-char.learner", 1, "first step")
        pids = [int((out / "services" / f"{n}.pid").read_text()) for n in svcs]
        proc.send_signal(signal.SIGTERM)
        _finish(proc, 60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_a_crash_looping_service_is_stopped_with_one_line_naming_it_and_its_last_error(tmp_path):
    # llama-char's rollout service points at an engine server that is not there: it exits at
    # start, is restarted once, and `up` stops with one line instead of restarting forever
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "mutualrl.app.cli", "up", str(ROOT / "examples" / "demo.yaml"), "--out",
                        str(tmp_path / "o"),
                        "--set", "budget.steps=1", "--set", "launcher.max_restarts=1", "--set",
                        "policies.0.engine.backend=vllm",
                        "--set", "policies.0.engine.url=http://127.0.0.1:9"], capture_output=True, text=True,
                       timeout=600)
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert p.returncode == 1, p.stderr[-2000:]
    assert len(lines) == 1 and "llama-char.rollout crashed 2 times" in lines[0], lines
    assert "EngineUnavailable: no vLLM server at http://127.0.0.1:9" in lines[0], lines
    assert time.monotonic() - t0 < 300


def test_up_hands_each_service_only_its_own_signing_key_and_its_sources(tmp_path, monkeypatch):
    from mutualrl.app.launcher import Supervisor
    from mutualrl.config import load_config
    from mutualrl.see.identity import SEE_KEYS_ENV, derive_key, parse_keys

    cfg = load_config(ROOT / "examples" / "demo.yaml")
    cfg = cfg.model_copy(update={"broker": cfg.broker.model_copy(update={"hmac_key_env": "MY_RUN_KEY"})})
    monkeypatch.setenv("MY_RUN_KEY", "run-secret")
    sup = Supervisor(cfg, tmp_path, echo=lambda s: None)
    sup.run_key = "run-secret"
    names = [p.name for p in cfg.policies]
    for s in sup.service_specs("redis://127.0.0.1:1/0", "mutualrl:t:1"):
        env = sup.service_env(s)
        assert "MY_RUN_KEY" not in env  # the run key never reaches a service
        keys = parse_keys(env[SEE_KEYS_ENV])
        own = f"{s.policy}.{s.role}"
        expected = {own, f"{s.policy}.learner"} if s.role == "rollout" else {own, *(f"{q}.rollout" for q in names)}
        assert set(keys) == expected and keys[own] == derive_key("run-secret", own)


def test_a_live_run_survives_control_plane_junk_a_stolen_key_and_an_impersonator(tmp_path, redis_server):
    """The attacks of the probe, on a live `mutualrl up` run over a shared Redis the attacker can
    write to: junk after every heartbeat and weights announcement of one policy, a rollout signed
    with that policy's stolen rollout key but far past its context and for no prompt of the run,
    a rollout from a producer named "mallory" (a key no receiver holds) and one validly signed by
    the peer's stolen key, both on the policy's own stream. The run
    loses no step, its rollout server follows every weights version, the bad rows are refused
    and dead-lettered, and every real rollout is trained on."""
    import threading

    from mutualrl.see.codec import EnvelopeCodec
    from mutualrl.see.identity import Keyring, derive_key
    from mutualrl.v1 import experience_pb2 as pb

    out = tmp_path / "run"
    os.environ["ATTACK_TEST_RUN_KEY"] = "known-run-key"
    try:
        proc = _start(out, 3, "broker.backend=redis", f"broker.url={redis_server.url}",
                      "broker.hmac_key_env=ATTACK_TEST_RUN_KEY")
    finally:
        del os.environ["ATTACK_TEST_RUN_KEY"]
    r = redis.Redis.from_url(redis_server.url)
    done = threading.Event()
    junked: list[str] = []

    def attacker(ns: str) -> None:
        seen: dict[str, int] = {}
        stolen = EnvelopeCodec(Keyring({"llama-char.rollout": derive_key("known-run-key", "llama-char.rollout")}))
        pill = pb.Rollout(prompt_id="not-a-prompt", step=1, token_ids=[1] * 5000, logprobs=[-1.0] * 5000, reward=1.0)
        r.xadd(f"{ns}:rollout:llama-char", {b"d": stolen.wrap_encoded(pill, "llama-char")[1]})
        mallory = EnvelopeCodec(Keyring({"mallory.rollout": derive_key("known-run-key", "mallory.rollout")}))
        r.xadd(f"{ns}:rollout:llama-char",
               {b"d": mallory.wrap_encoded(pb.Rollout(prompt_id="x", step=1, reward=1.0), "mallory")[1]})
        # a peer's stolen key
        peer = EnvelopeCodec(Keyring({"qwen-bpe.rollout": derive_key("known-run-key", "qwen-bpe.rollout")}))
        r.xadd(f"{ns}:rollout:llama-char",
               {b"d": peer.wrap_encoded(pb.Rollout(prompt_id="x", step=1, reward=1.0), "qwen-bpe")[1]})
        while not done.is_set():
            for stream in (f"{ns}:heartbeat:llama-char.learner", f"{ns}:heartbeat:llama-char.rollout",
                           f"{ns}:weights_published:llama-char"):
                n = r.xlen(stream)
                if n and n != seen.get(stream):
                    r.xadd(stream, {b"d": b"\x00junk after the newest entry"})
                    junked.append(stream)
                    seen[stream] = n + 1
            time.sleep(0.05)

    try:
        path = out / "services.json"
        info = _wait(lambda: json.loads(path.read_text()) if path.is_file() else proc.poll(), 300, "services.json")
        assert isinstance(info, dict), proc.communicate()[0][-3000:]
        t = threading.Thread(target=attacker, args=(info["namespace"],), daemon=True)
        t.start()
        output = _finish(proc)
    finally:
        done.set()
        proc.kill()
    assert proc.returncode == 0, output[-3000:]
    assert len(junked) >= 6  # junk followed heartbeats and announcements all run long
    steps = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s.get("phase") != "warm_start"]
    # no step lost
    assert {(s["policy"], s["step"]) for s in steps} == {(p, k) for p in ("llama-char", "qwen-bpe") for k in (1, 2, 3)}
    mine = sorted((s for s in steps if s["policy"] == "llama-char"), key=lambda s: s["step"])
    # nothing displaced
    assert [s["weights_version"] for s in mine] == [1, 2, 3] and all(s["own_rollouts"] == 16 * 8 for s in mine)
    ledger = (out / "services" / "llama-char.rollout.ledger.jsonl").read_text().splitlines()
    versions = [json.loads(l)["weights_version"] for l in ledger]
    assert versions == [0, 1, 2]  # the rollout server followed every announcement despite the junk after it
    reasons = {bytes(f[b"d"]).split(b"\x00", 1)[0].decode() for _, f in r.xrange(f"{info['namespace']}:deadletter")}
    # junk; mallory, whose key the learner does not hold; the peer's message on another's stream
    assert {"decode_error", "bad_signature", "wrong_producer"} <= reasons, reasons
    assert "Traceback" not in (out / "logs" / "llama-char.learner.log").read_text()  # the pill crashed nothing
    totals = json.loads((out / "services" / "llama-char.learner.done").read_text())["totals"]
    assert totals.get("own_rejected:unknown_prompt") == 1  # the stolen-key rollout: refused before any tensor
