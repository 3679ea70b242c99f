"""benchmarks/cpu_timeline.py: a command's CPU time by process role, read from /proc while it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_busy_child_is_counted_under_its_role_and_the_exit_status_passes_through(tmp_path):
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.8: pass\nraise SystemExit(3)"
    out = tmp_path / "cpu.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cpu_timeline.py"), "--every", "0.1", "--json",
                           str(out), "--", sys.executable, "-c", busy], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    data = json.loads(out.read_text())
    role = Path(sys.executable).name  # process_memory.role: the program's name for a process of no known role
    assert 0.5 < data["cpu_s"][role] < 2.0  # the 0.8 s it burnt (a tick's rounding and the interpreter's start)
    assert max(r["cores"].get(role, 0) for r in data["timeline"]) > 0.5  # a busy interval shows a busy core
    assert "CPU seconds by role" in proc.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_run_measured_samples_the_trees_memory_over_time(tmp_path):
    """benchmarks/process_memory.run_measured: the peak and the timeline a benchmark lines up with its steps."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from process_memory import run_measured
    finally:
        sys.path.pop(0)
    hold = "import time\nb = bytearray(300 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\ntime.sleep(1.0)"
    m = run_measured([sys.executable, "-c", hold], tmp_path / "hold.log")
    assert m["peak_anon_gib"] > 0.28  # the 300 MiB it touched
    times = [t for t, _, _ in m["timeline"]]
    assert len(times) >= 3 and times == sorted(times)
    assert max(a for _, _, a in m["timeline"]) == pytest.approx(m["peak_anon_gib"], abs=0.01)
    # the host's state beside the figures: its free memory at the start, its major page faults meanwhile
    assert 0 < m["host"]["available_gib_at_start"] < 4096 and m["host"]["major_faults"] >= 0
