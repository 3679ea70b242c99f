"""Fixed-seed runs whose metrics must not change when the code is reorganised (issue: one learner
loop for every rank). ``python tests/e2e/golden_runs.py record`` writes their metrics, without
the wall-clock fields, to ``tests/e2e/golden/``; ``test_fixed_seed_metrics.py`` reruns them and
compares. Floating-point results depend on the CPU's vector instructions and the torch build, so
each file records both, and the test compares only on a machine that matches. One recording per machine kind:
``<run>.json`` (the first, on AVX2), ``<run>.<cpu capability>.json`` and ``<run>.<cpu capability>-<flags digest>.json``
for each kind recorded since, so a CI machine of a recorded kind checks the numbers instead of skipping."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

from mutualrl.models.precision import cpu_flags

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
# seconds and timestamps differ on every run; everything else is a function of the seed
# measured, not computed: seconds, and the process's memory per stage (which depends on the machine and allocator)
TIMING_KEYS = {"step_s", "gen_s", "train_s", "wall_time", "stage_seconds", "stage_peak_rss_gib"}
# the demo's own warm start (cached once per test session, shared with the other runs of the demo)
# so the policies have rewards to learn from; three short steps of each mode after it
# the recording's learner computed every row's whole sequence: the shared prompt forward (on by default since) gives
# the same log-probs to float rounding, not bit for bit
SMALL = ["budget.steps=3", "budget.prompts_per_step=8", "eval.every=3", "eval.size=32",
         "algorithm.share_prompt_forward=false"]
RUNS = {
    "embedded-sgt": ["sharing.mode=sgt"],
    "embedded-hacpo": ["sharing.mode=hacpo", "algorithm.kl_coef=0.001", "algorithm.minibatch_rows=32"],
    "embedded-xgrpo": ["sharing.mode=xgrpo"],
}


def cpu_vector_flags() -> str:
    """This CPU's AVX-512 and AMX flags from ``/proc/cpuinfo``, sorted ("" where there are none or no such file).
    torch's capability says "AVX512" for every AVX-512 CPU, yet two of them (2026-12-02: one with AMX and
    AVX512-FP16, one recorded earlier) trained the fixed-seed runs to different fp32 numbers."""
    return " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx"))))


def machine() -> dict:
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "cpu_flags": cpu_vector_flags()}


def recordings(name: str) -> list[dict]:
    """Every recording of ``name``: ``<run>.json`` and the ``<run>.<machine kind>.json`` beside it."""
    paths = [GOLDEN / f"{name}.json", *sorted(GOLDEN.glob(f"{name}.*.json"))]
    return [json.loads(p.read_text()) for p in paths if p.is_file()]


def golden_for(name: str) -> dict | None:
    """The recording of ``name`` made on a machine like this one, or None: one with the same CPU flags first; then
    one recorded before the flags were (CPU capability and torch alike)."""
    this = machine()
    found = recordings(name)
    exact = next((g for g in found if g["machine"] == this), None)
    if exact is not None:
        return exact
    coarse = {k: v for k, v in this.items() if k != "cpu_flags"}
    return next((g for g in found if "cpu_flags" not in g["machine"] and g["machine"] == coarse), None)


def machine_kind(m: dict) -> str:
    """A recording's file-name part: the CPU capability, and a short digest of its CPU flags where it has them."""
    if not m.get("cpu_flags"):
        return m["cpu_capability"]
    return f"{m['cpu_capability']}-{hashlib.sha256(m['cpu_flags'].encode()).hexdigest()[:8]}"


def without_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def run(name: str, out: Path, extra: tuple[str, ...] = ()) -> list[dict]:
    """One golden run through the CLI entry point (in this process), with ``extra`` overrides; its metrics
    without timings."""
    from typer.testing import CliRunner

    from mutualrl.app.cli import app

    args = ["run", str(ROOT / "examples" / "demo.yaml"), "--out", str(out)]
    for s in SMALL + RUNS[name] + list(extra):
        args += ["--set", s]
    result = CliRunner().invoke(app, args)
    if result.exit_code != 0:
        raise RuntimeError(f"golden run {name} failed: {result.output[-2000:]} {result.exception!r}")
    return without_timing([json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()])


def record(out_root: Path) -> None:
    """Record every run on this machine, beside (never over) a recording from another machine kind."""
    GOLDEN.mkdir(exist_ok=True)
    this = machine()
    for name in RUNS:
        records = run(name, out_root / name)
        path = GOLDEN / f"{name}.json"
        if path.is_file() and json.loads(path.read_text())["machine"] != this:
            path = GOLDEN / f"{name}.{machine_kind(this)}.json"
        path.write_text(json.dumps({"machine": this, "records": records}, indent=1) + "\n")
        print(f"recorded {name}: {len(records)} records -> {path.name}")


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["record"]:
        sys.exit("usage: python tests/e2e/golden_runs.py record")
    with tempfile.TemporaryDirectory() as d:
        record(Path(d))
