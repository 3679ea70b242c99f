"""SGT-R under `mutualrl up` on a real Redis: each learner's rescue round is sampled by its own rollout service over
SEE (a signed SampleRequest, a SampleResult back), and the per-edge counts reach the records and Prometheus."""

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from test_services_up import _health, _wait

ROOT = Path(__file__).resolve().parents[2]


def test_rescue_samples_flow_between_learner_and_rollout_services_with_per_edge_counts(tmp_path):
    out = tmp_path / "run"
    sets = ["budget.steps=2", "budget.prompts_per_step=16", "eval.every=100", "eval.size=32", "sharing.mode=sgt_r",
            "sharing.sgt_r.min_gain=null", "sharing.sgt_r.max_prompts=3", "sharing.sgt_r.samples=2",
            "launcher.peer_deadline_s=10"]
    cmd = [sys.executable, "-m", "mutualrl.app.cli", "up", str(ROOT / "examples" / "demo.yaml"), "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        def alive(pred):  # a run that died says so at once, not after the wait's deadline
            def check():
                assert proc.poll() is None, proc.stdout.read()[-3000:]
                return pred()
            return check

        svcs = _wait(alive(lambda: json.loads((out / "services.json").read_text())["services"]
                           if (out / "services.json").is_file() else None), 600, "services.json")
        learners = {n: s for n, s in svcs.items() if s["role"] == "learner"}
        _wait(alive(lambda: all(_health(s["ops"]).get("step", 0) >= 1 for s in learners.values())), 600, "step 1")
        scraped = {n: urllib.request.urlopen(s["ops"] + "/metrics", timeout=5).read().decode()
                   for n, s in learners.items()}
        output = proc.communicate(timeout=900)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-3000:]
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("phase") != "warm_start" and r.get("step", 0) >= 1]
    assert {(r["policy"], r["step"]) for r in steps} == {(p, s) for p in ("llama-char", "qwen-bpe") for s in (1, 2)}
    for name, peer in (("llama-char", "qwen-bpe"), ("qwen-bpe", "llama-char")):
        mine = [r for r in steps if r["policy"] == name]
        assert sum(r["rescue_samples"] for r in mine) > 0, mine  # its rollout service answered the rounds
        assert not any(k.startswith("unavailable") for r in mine for k in (r["hint_refused"] or {}))
        # the rescue samples are the policy's rollouts too: the budget compared across entries counts them
        assert [r["rollouts"] for r in mine] == [sum(x["own_rollouts"] + x["rescue_samples"] for x in mine[:i + 1])
                                                 for i in range(len(mine))]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["policies"][name]["rollouts"] == mine[-1]["rollouts"]
    for name in ("llama-char", "qwen-bpe"):  # every evaluation kept problem by problem: step 0 and the last
        evals = [json.loads(l) for l in (out / "evals" / f"{name}.jsonl").read_text().splitlines()]
        assert [e["step"] for e in evals] == [0, 2] and all(len(e["correct"]) == len(e["texts"]) == 32 for e in evals)
    for name, text in scraped.items():  # after step 1: per edge, from 0, and counting
        assert 'mutualrl_edge_messages_total{event="rescue_samples"' in text, name
        assert 'mutualrl_hint_refused_total{policy=' in text, name
        samples = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("mutualrl_edge_messages_total{") and 'event="rescue_samples"' in line]
        assert sum(samples) > 0, name
