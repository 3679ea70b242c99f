"""`mutualrl compare` as a person runs it: progress lines when its output is piped, one Ctrl-C stops
every run in progress and keeps the finished ones, and two jobs wanting one starting point train it once."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["policies.0.warm_start.enabled=false", "policies.1.warm_start.enabled=false", "budget.prompts_per_step=4",
         "budget.group_size=4", "eval.size=16", "eval.every=2", "task.eval_size=16", "task.train_size=400"]


def _spec(tmp_path: Path, steps: int) -> Path:
    entries = {"grpo": ["sharing.mode=none", *QUICK], "sgt": ["sharing.mode=sgt", *QUICK]}
    lines = [f"name: ctrlc\nbaseline: grpo\nseeds: [0, 1]\nsteps: {steps}\npairs: {{demo: "
             f"{ROOT / 'examples' / 'demo.yaml'}}}\nentries:"]
    lines += [f"  {k}: [{', '.join(repr(x) for x in v)}]" for k, v in entries.items()]
    (tmp_path / "spec.yaml").write_text("\n".join(lines) + "\n")
    return tmp_path / "spec.yaml"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_one_ctrl_c_stops_every_run_and_keeps_the_finished_ones_with_piped_progress(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "mutualrl.app.cli", "compare", str(_spec(tmp_path, steps=4)), "--out", str(out),
           "--jobs", "2"]
    # its own process group, as a shell gives a job: a terminal's Ctrl-C reaches every process in it
    # and Ctrl-C handled as at a terminal, even when this test runs as a background job (a shell
    # starts those with SIGINT ignored, and a child inherits that)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if "finished in" in line:
            break
    # "in", not "startswith": a run's own output shares the pipe and may have left a line without its newline
    assert any("run 1/4 finished in" in line for line in lines), "".join(lines)[-2000:]
    assert not any("Writing model shards" in line for line in lines)  # no library progress bars in the lines
    assert "left" in lines[-1] and "grpo / demo / seed 0" in "".join(lines) + "sgt / demo / seed 0"
    os.killpg(proc.pid, signal.SIGINT)  # one press
    try:
        rest = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, rest[-2000:]
    assert "Traceback" not in rest and "stopped:" in rest and "runs finished and kept" in rest
    for _ in range(20):  # multiprocessing's resource tracker leaves by itself once its parent is gone
        if not _group_alive(proc.pid):
            break
        time.sleep(0.5)
    left = subprocess.run(["ps", "-o", "pid,args", "-g", str(proc.pid)], capture_output=True, text=True).stdout
    assert not _group_alive(proc.pid), f"a process of the compare survived the Ctrl-C:\n{left}"
    finished = sorted(out.glob("runs/*/*/*/summary.json"))
    assert 1 <= len(finished) < 4
    kept = int(rest.split("stopped: ")[1].split(" of ")[0])
    assert kept == len(finished)
    for summary in finished:  # each run's phases and steps, for `tail -f` and the live table
        progress = (summary.parent / "progress.log").read_text()
        assert "building task arithmetic" in progress and "step 4/4" in progress
    started = sorted(out.glob("runs/*/*/*/config.yaml"))
    assert len(started) <= 3, "the workers started more runs after the Ctrl-C"


def _warm(cache: str, queue) -> None:
    import torch

    torch.set_num_threads(1)
    from mutualrl.config.schema import WarmStartConfig
    from mutualrl.models import build_model, build_tokenizer
    from mutualrl.models.families import ModelShape
    from mutualrl.runtime.warm_start import warm_start
    from mutualrl.tasks import build_task, build_verifier

    task = build_task("arithmetic", seed=0, max_digits=1, train_size=200, eval_size=8)
    tok = build_tokenizer("char", task.corpus(), 0)
    ids = {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    model = build_model("llama", len(tok), ModelShape(32, 1, 2, 64, 32), ids, seed=0)
    cfg = WarmStartConfig(max_steps=40, target_accuracy=1.0, check_every=20, batch_size=8, eval_size=8)
    res = warm_start(model, tok, task.train, build_verifier(None, task), cfg, source="same-start",
                     task_fingerprint=task.fingerprint(),
                     seed=0, max_new_tokens=3, cache_dir=Path(cache))
    queue.put(res.cached)


def test_two_jobs_wanting_one_starting_point_train_it_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_warm, args=(str(tmp_path), queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert results == [False, True]  # one trained it, the other waited and loaded it
