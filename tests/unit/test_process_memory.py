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
