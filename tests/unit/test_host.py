"""A run names its machine in summary.json: the CPU facts that change bf16's rounding, and torch's."""

from __future__ import annotations

import json

import torch

from mutualrl.runtime.host import host_info, host_key, parse_cpuinfo
from mutualrl.runtime.outputs import write_summary

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8481C
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile amx_bf16 avx512vl

processor\t: 1
model name\t: another core that is not read
flags\t\t: fpu
"""


def test_the_first_processor_names_the_cpu_and_its_bf16_flags_in_a_fixed_order():
    assert parse_cpuinfo(CPUINFO) == {"cpu": "Intel(R) Xeon(R) Platinum 8481C", "cpu_model": "6/143",
                                      "flags": ["avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]}


def test_a_cpu_without_bf16_instructions_has_only_the_flags_it_has():
    amd = "cpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2\n"
    assert parse_cpuinfo(amd) == {"cpu": "AMD EPYC 7B13", "cpu_model": "25/1", "flags": ["avx2"]}


def test_host_info_reads_the_given_cpuinfo_and_torch(tmp_path):
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    h = host_info(tmp_path / "cpuinfo")
    assert h["cpu"] == "Intel(R) Xeon(R) Platinum 8481C" and h["flags"][-1] == "amx_tile"
    assert h["torch"] == torch.__version__ and h["threads"] == torch.get_num_threads()
    assert h["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def test_without_a_cpuinfo_file_the_platform_names_the_machine(tmp_path):
    h = host_info(tmp_path / "absent")
    assert h["cpu"] and h["cpu_model"] is None and h["flags"] == []


def test_two_machines_get_different_keys_and_an_old_run_none():
    a = {**parse_cpuinfo(CPUINFO), "torch": "2.13.0", "threads": 2}
    b = {**a, "flags": ["avx2"]}
    assert host_key(a) == "Intel(R) Xeon(R) Platinum 8481C (6/143), avx2+avx512f+avx512_bf16+amx_bf16+amx_tile, " \
                          "torch 2.13.0"
    assert host_key(a) != host_key(b)
    assert host_key({**a, "threads": 16}) == host_key(a)  # the thread count is the compare's own setting
    assert host_key(None) is None and host_key({}) is None


def test_every_summary_names_its_machine(tmp_path):
    write_summary(tmp_path, "r", "none", 2, {"p": {"final_accuracy": 0.5}})
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["host"] == host_info()
    assert list(s)[-1] == "policies"
