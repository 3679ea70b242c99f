"""The process memory helpers (mutualrl.runtime.memory): per-stage peaks of resident memory read from the
kernel, the learner's record field ``stage_peak_rss_gib``."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from mutualrl.runtime import memory
from mutualrl.runtime.memory import StagePeaks, peak_resident_bytes, reset_peak_resident, return_freed_memory

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@linux_only
def test_a_stage_peak_sees_what_the_stage_allocated_and_the_next_stage_starts_afresh():
    peaks = StagePeaks()
    assert peaks.enabled
    assert reset_peak_resident()
    base = peak_resident_bytes()  # what the process holds now: its lifetime peak may lie far above (earlier tests)
    peaks.enter("big")
    block = np.ones(400 * 2**20 // 8)  # 400 MiB, touched
    del block
    peaks.enter("small")  # the 400 MiB are freed: this stage's peak starts from what the process holds now
    peaks.enter(None)
    assert set(peaks.peaks) == {"big", "small"}
    assert peaks.peaks["big"] - peaks.peaks["small"] > 0.3  # GiB: the big stage's block, not the small stage's
    assert peaks.peaks["big"] * 2**30 >= base


@linux_only
def test_resetting_the_peak_brings_it_down_to_what_is_resident_now():
    block = np.ones(200 * 2**20 // 8)
    del block
    before = peak_resident_bytes()
    assert reset_peak_resident()
    assert peak_resident_bytes() < before


def test_without_proc_the_stages_are_silent(monkeypatch):
    import mutualrl.runtime.memory as memory

    monkeypatch.setattr(memory, "reset_peak_resident", lambda: False)
    peaks = memory.StagePeaks()
    peaks.enter("train")
    peaks.enter(None)
    assert not peaks.enabled and peaks.peaks == {}


def test_the_trim_can_be_turned_off_for_a_host_with_memory_to_spare(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "_libc_trim", lambda: lambda pad: calls.append(pad) or 1)
    assert return_freed_memory() is True and calls == [0]
    for off in ("0", "false", "OFF", "no"):
        monkeypatch.setenv(memory.RETURN_FREED_MEMORY_ENV, off)
        assert return_freed_memory(collect=True) is False
    assert calls == [0]  # never trimmed while off
    monkeypatch.setenv(memory.RETURN_FREED_MEMORY_ENV, "1")
    assert return_freed_memory() is True and calls == [0, 0]


def test_the_caller_says_whether_to_trim_and_the_environment_overrides_it(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "_libc_trim", lambda: lambda pad: calls.append(pad) or 1)
    monkeypatch.delenv(memory.RETURN_FREED_MEMORY_ENV, raising=False)
    assert return_freed_memory(default=False) is False and calls == []  # `run`'s learners: nobody to give to
    assert return_freed_memory(default=True) is True and calls == [0]
    monkeypatch.setenv(memory.RETURN_FREED_MEMORY_ENV, "on")
    assert return_freed_memory(default=False) is True and calls == [0, 0]  # forced on
    monkeypatch.setenv(memory.RETURN_FREED_MEMORY_ENV, "off")
    assert return_freed_memory(default=True) is False and calls == [0, 0]  # forced off


def test_with_free_below_it_trims_only_while_memory_is_short(monkeypatch):
    calls, share = [], {"now": 0.8}
    monkeypatch.setattr(memory, "_libc_trim", lambda: lambda pad: calls.append(pad) or 1)
    monkeypatch.setattr(memory, "free_memory_share", lambda: share["now"])
    monkeypatch.delenv(memory.RETURN_FREED_MEMORY_ENV, raising=False)
    assert return_freed_memory(free_below=0.5) is False and calls == []  # 80 % free: keep the pages
    share["now"] = 0.3
    assert return_freed_memory(free_below=0.5) is True and calls == [0]  # 30 % free: give them back
    assert return_freed_memory(default=False, free_below=0.5) is False and calls == [0]  # `run`: never
    share["now"] = None
    assert return_freed_memory(free_below=0.5) is True and calls == [0, 0]  # cannot tell: trim
    share["now"] = 0.9
    monkeypatch.setenv(memory.RETURN_FREED_MEMORY_ENV, "1")
    assert return_freed_memory(free_below=0.5) is True and calls == [0, 0, 0]  # forced: short or not
    monkeypatch.setenv(memory.RETURN_FREED_MEMORY_ENV, "0")
    share["now"] = 0.1
    assert return_freed_memory(free_below=0.5) is False and calls == [0, 0, 0]  # forced off: short or not


def _meminfo(tmp_path, total_kib, available_kib):
    (tmp_path / "meminfo").write_text(f"MemTotal:       {total_kib} kB\nMemFree:        1 kB\n"
                                      f"MemAvailable:   {available_kib} kB\n")
    return str(tmp_path / "meminfo")


def test_the_free_share_is_the_hosts_or_a_smaller_cgroup_limits(tmp_path):
    proc = _meminfo(tmp_path, 1000, 600)
    cg = tmp_path / "cg"
    cg.mkdir()
    assert memory.free_memory_share(proc, str(cg)) == pytest.approx(0.6)  # no cgroup files: the host's
    (cg / "memory.max").write_text("max\n")
    (cg / "memory.current").write_text("123\n")
    assert memory.free_memory_share(proc, str(cg)) == pytest.approx(0.6)  # v2 without a limit
    (cg / "memory.max").write_text(f"{4 * 2**30}\n")
    (cg / "memory.current").write_text(f"{3 * 2**30}\n")
    assert memory.free_memory_share(proc, str(cg)) == pytest.approx(0.25)  # a pod's limit, 3 of 4 GiB used
    (cg / "memory.current").write_text(f"{5 * 2**30}\n")
    assert memory.free_memory_share(proc, str(cg)) == 0.0  # over its limit (page cache counted): short
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{2**63 - 4096}\n")  # v1's "no limit"
    (v1 / "memory" / "memory.usage_in_bytes").write_text("100\n")
    assert memory.free_memory_share(proc, str(v1)) == pytest.approx(0.6)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("1000\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text("900\n")
    assert memory.free_memory_share(proc, str(v1)) == pytest.approx(0.1)
    assert memory.free_memory_share(str(tmp_path / "none"), str(tmp_path / "none")) is None


@linux_only
def test_this_hosts_free_share_is_a_fraction():
    share = memory.free_memory_share()
    assert share is not None and 0.0 <= share <= 1.0


_CYCLES = """
import resource, sys
from mutualrl.runtime.memory import reuse_freed_pages
import torch
took = reuse_freed_pages()
for i in range(24):
    if i == 12:  # the heap's holes settle in the first cycles (a small block lands above each freed tensor)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.empty(48 * 2**20 // 4).fill_(1.0)  # 48 MiB, over glibc's largest mmap threshold: an op's logits
    del t
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults_of_twelve_tensors(env: dict) -> tuple[bool, int]:
    import os
    import subprocess

    out = subprocess.run([sys.executable, "-c", _CYCLES], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    return out[0] == "True", int(out[1])


@linux_only
def test_reusing_freed_pages_stops_each_new_tensor_from_faulting_in_fresh_pages():
    """Under glibc's defaults each 48 MiB tensor is a fresh mmap: 12,288 page faults, every time. With the
    project's settings, once the heap has settled, a new tensor gets a freed one's pages (a separate process each:
    the allocator's settings are process-wide, and this test process keeps glibc's)."""
    took, reused = _faults_of_twelve_tensors({memory.REUSE_FREED_PAGES_ENV: "1"})
    took_default, default = _faults_of_twelve_tensors({memory.REUSE_FREED_PAGES_ENV: "0"})
    if not took:
        pytest.skip("the C allocator is not glibc")
    assert took_default is False  # the switch turns it off
    assert default > 12 * 12_000  # every tensor faulted in afresh
    assert reused < default / 5


def test_reusing_freed_pages_is_a_no_op_without_glibc_or_when_turned_off(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "_libc_mallopt", lambda: lambda param, value: calls.append((param, value)) or 1)
    assert memory.reuse_freed_pages() is True
    assert calls == [(memory._M_MMAP_MAX, 0), (memory._M_TRIM_THRESHOLD, 2**31 - 1)]
    monkeypatch.setenv(memory.REUSE_FREED_PAGES_ENV, "off")
    assert memory.reuse_freed_pages() is False and len(calls) == 2
    monkeypatch.delenv(memory.REUSE_FREED_PAGES_ENV)
    monkeypatch.setattr(memory, "_libc_mallopt", lambda: None)
    assert memory.reuse_freed_pages() is False
