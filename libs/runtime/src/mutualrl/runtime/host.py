"""Which machine a run's numbers came from, written into its ``summary.json``.

Why: bf16 matmuls round differently on different CPUs (AVX-512 BF16, AMX tiles, or emulation), so one seed, spec and
code can train differently on two machines. On `products` at seed 0 that alone moved isolated GRPO from 25.0 to
17.2 % held-out (docs/results/real/sgt-r/README.md, "SGT-R and resample-only at seed 0 under the cut-off rule"), as
much as a sharing mode's whole effect. A compare pairs runs seed by seed, so it has to know when a seed's runs came
from different machines (`host_key`); the report warns then.
"""

from __future__ import annotations

import platform
from pathlib import Path

import torch

from mutualrl.models.precision import cpu_flags

# the instruction sets that change how a CPU computes bf16 (and so a run's numbers), in the order they are named
NUMERIC_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def _first(cpuinfo: str, key: str) -> str | None:
    """The first processor's value of ``key`` (a run's cores are one kind)."""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.strip()
    return None


def parse_cpuinfo(text: str) -> dict:
    """The first processor's model name, family/model and numeric flags from ``/proc/cpuinfo``'s text."""
    flags = cpu_flags(text)
    family, model = _first(text, "cpu family"), _first(text, "model")
    return {"cpu": _first(text, "model name") or platform.processor() or platform.machine(),
            "cpu_model": f"{family}/{model}" if family and model else None,
            "flags": [f for f in NUMERIC_FLAGS if f in flags]}


def host_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict:
    """This machine as a run records it: the CPU (name, family/model, numeric flags), torch's version and the CPU
    kernels it picked, and its thread count."""
    try:
        cpu = parse_cpuinfo(cpuinfo.read_text())
    except OSError:  # not Linux: the platform's own name is what there is
        cpu = {"cpu": platform.processor() or platform.machine(), "cpu_model": None, "flags": []}
    return {**cpu, "torch": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads()}


def host_key(host: dict | None) -> str | None:
    """What must match for two runs' numbers to be comparable bit for bit (the thread count aside, which a compare
    sets itself); ``None`` for a run recorded before summaries named their machine."""
    if not host:
        return None
    flags = "+".join(host.get("flags") or []) or "no bf16 flags"
    model = f" ({host['cpu_model']})" if host.get("cpu_model") else ""
    return f"{host.get('cpu')}{model}, {flags}, torch {host.get('torch')}"
