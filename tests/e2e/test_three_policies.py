"""Three policies of three families and three vocabularies under a sharing graph with a different mode per
learner (examples/three-policies.yaml), through `mutualrl run` and `mutualrl up`: every learner trains, each
reads only its incoming edges under its own mode, and every record counts per edge what travelled."""

import json
import math
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mutualrl.app.cli import app

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "three-policies.yaml"
# the demo's two warm starts are shared with the other tests; the GPT-2 starts cold (a CI budget)
SMALL = ["budget.steps=2", "budget.prompts_per_step=8", "eval.every=2", "eval.size=16",
         "policies.2.warm_start.enabled=false"]
EDGES = {"llama-char": {"qwen-bpe->llama-char", "gpt2-unigram->llama-char"},
         "qwen-bpe": {"llama-char->qwen-bpe", "gpt2-unigram->qwen-bpe"},
         "gpt2-unigram": {"qwen-bpe->gpt2-unigram"}}


def _check(records: list[dict]) -> None:
    steps = [r for r in records if r.get("phase") != "warm_start"]
    assert sorted((r["policy"], r["step"]) for r in steps) == sorted((p, s) for p in EDGES for s in (1, 2))
    for r in steps:
        assert math.isfinite(r["loss"]) and r["weights_version"] == r["step"], r
        assert set(r["edges"]) == EDGES[r["policy"]], r["edges"]  # only its incoming edges
        for counts in r["edges"].values():  # nothing used or refused that was not offered
            assert counts["used"] + counts["stale"] + counts["thl_rejected"] <= counts["offered"], counts
            assert counts["rescues"] <= counts["offered"], counts
    by = {p: [r for r in steps if r["policy"] == p] for p in EDGES}
    # each learner under its own mode: XGRPO pools stats, SGT rescues, PRP trains converted peer rows
    assert all(r["xgrpo_baseline_mean"] is not None and r["shared_in"] == 16 for r in by["llama-char"])
    assert all(r["peer_rows"] == 0 for r in by["llama-char"] + by["qwen-bpe"])
    assert all(r["peer_rows"] == 64 and r["edges"]["qwen-bpe->gpt2-unigram"]["used"] == 64 for r in by["gpt2-unigram"])
    assert sum(r["rescue_count"] for r in by["qwen-bpe"]) == sum(
        e["rescues"] for r in by["qwen-bpe"] for e in r["edges"].values())


def test_three_policies_under_a_sharing_graph_run_embedded(tmp_path, monkeypatch):
    import mutualrl.runtime.memory as memory

    trims = []  # one process holds every policy: no learner hands its freed pages to the host
    monkeypatch.delenv(memory.RETURN_FREED_MEMORY_ENV, raising=False)
    monkeypatch.setattr(memory, "_libc_trim", lambda: lambda pad: trims.append(pad) or 1)
    args = ["run", str(CONFIG), "--out", str(tmp_path / "o")]
    for s in SMALL:
        args += ["--set", s]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (result.output[-3000:], result.exception)
    assert trims == []
    _check([json.loads(line) for line in (tmp_path / "o" / "metrics.jsonl").read_text().splitlines()])


@pytest.mark.slow  # the same graph runs embedded above in `make test`; services of two policies in test_services_up
def test_three_policies_under_a_sharing_graph_run_as_services(tmp_path):
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "mutualrl.app.cli", "up", str(CONFIG), "--out", str(out)]
    for s in SMALL + ["budget.steps=3"]:
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        scraped = ""
        while proc.poll() is None and "mutualrl_edge_messages_total" not in scraped:
            services = out / "services.json"
            if services.is_file():
                learner = json.loads(services.read_text())["services"]["llama-char.learner"]
                try:
                    scraped = urllib.request.urlopen(learner["ops"] + "/metrics", timeout=5).read().decode()
                except OSError:
                    pass
            time.sleep(0.5)
        output, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-3000:]
    assert 'mutualrl_edge_messages_total{event="offered",policy="llama-char",source="gpt2-unigram"}' in scraped
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    _check([r for r in records if r.get("step", 0) <= 2])
    assert json.loads((out / "summary.json").read_text())["sharing_mode"].startswith("graph: ")
