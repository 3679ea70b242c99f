"""benchmarks/gpu/run_all.sh --dry-run: every section of the GPU script runs its code on the CPU with tiny
models, so a lent device's minutes go to measuring, not to debugging (issue #43)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAST_SECTIONS = ("env", "learner_step", "logprob_memory", "engine", "weights_transport", "run_5_steps",
                 "run_real_shapes", "vs_trl_cuda", "cpu_bf16")
SLOW_SECTIONS = ("sampling_copy", "pair_memory_bf16")  # dry, more runs of the same code paths: `make test-slow`


def _dry(tmp_path, sections: list[str]) -> dict:
    only = [a for s in sections for a in ("--only", s)]
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu" / "run_all.sh"), "--dry-run", *only],
                          env={**os.environ, "OUT": str(tmp_path)}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((tmp_path / "gpu.json").read_text())


def test_the_gpu_script_runs_every_section_dry(tmp_path):
    out = _dry(tmp_path, list(FAST_SECTIONS))
    s = out["sections"]
    assert out["dry_run"] is True and out["device"] == "cpu"
    assert {k: v["status"] for k, v in s.items()} == {k: "ok" for k in FAST_SECTIONS}
    assert s["env"]["measured_matmul_tflops"] > 0
    assert set(s["learner_step"]["archs"]) == {"smollm2-135m", "qwen2.5-0.5b", "qwen2.5-1.5b"}
    assert all(a["tokens_per_s"] > 0 and a["scaled_loss_step_s"] > 0 for a in s["learner_step"]["archs"].values())
    assert s["engine"]["ours_tokens_per_s"] > 0 and s["engine"]["generate_tokens_per_s"] > 0
    assert len(s["weights_transport"]["versions"]) == 5 and s["weights_transport"]["engine_exit"] == 0
    assert s["run_5_steps"]["step_records"] == 4
    assert set(s["run_real_shapes"]["timings_last_step"]) == {"smollm2-shape", "qwen05b-shape"}
    assert all(t["gen_s"] > 0 for t in s["run_real_shapes"]["timings_last_step"].values())
    # against TRL: both sides trained the same tiny random-weight model (here on the CPU) and were timed
    assert s["vs_trl_cuda"]["bf16"]["run"]["steps_per_s"] > 0 and s["vs_trl_cuda"]["bf16"]["trl"]["steps_per_s"] > 0
    assert s["vs_trl_cuda"]["bf16"]["run_over_trl"] > 0
    # a CPU without bf16 instructions is said so, not measured in emulated bf16; one with them is measured
    if s["cpu_bf16"]["bf16_flags"]:
        assert s["cpu_bf16"]["ours_bf16_over_fp32"] > 0
    else:
        assert "no bf16" in s["cpu_bf16"]["skipped"]


@pytest.mark.slow
def test_the_gpu_scripts_further_sections_run_dry(tmp_path):
    s = _dry(tmp_path, list(SLOW_SECTIONS))["sections"]
    assert {k: v["status"] for k, v in s.items()} == {k: "ok" for k in SLOW_SECTIONS}
    assert s["sampling_copy"]["cpu"]["run"]["stages"]["weight_sync"] > 0  # the copy is synced, not shared
    up = s["pair_memory_bf16"]["up_bf16-mixed"]
    assert up["steps"] == 1 and up["peak_anon_gib"] > 0
    assert {"learner smollm2", "learner qwen-coder", "rollout smollm2", "rollout qwen-coder"} <= set(
        up["process_peak_anon_gib"])


def test_a_failing_section_costs_one_figure_not_the_run(tmp_path):
    """A section that raises keeps its traceback in the JSON and the next section still runs."""
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu" / "run_all.sh"), "--dry-run", "--only", "env",
                           "--only", "engine"],
                          env={**os.environ, "OUT": str(tmp_path), "MUTUALRL_GPU_FAIL": "env"},
                          capture_output=True, text=True, timeout=300)
    out = json.loads((tmp_path / "gpu.json").read_text())["sections"]
    assert out["env"]["status"] == "failed" and "planted failure" in out["env"]["traceback"]
    assert out["engine"]["status"] == "ok"
    assert proc.returncode == 1  # a dry run with a failed section fails make test


def test_every_section_is_run_dry_by_one_of_the_tests(load_script):
    run_all = load_script("benchmarks/gpu/run_all.py")
    assert [name for name, _, _ in run_all.SECTIONS] == [*FAST_SECTIONS, *SLOW_SECTIONS]
