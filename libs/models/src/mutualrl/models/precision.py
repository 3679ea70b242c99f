"""Which numbers a policy computes in: full fp32, or bf16 mixed precision where the hardware has it.

``model.dtype`` (docs/algorithms.md §7.1):

- ``float32``: weights, activations, log-probs and the loss in fp32 (tests and golden runs pin it);
- ``bf16-mixed``: fp32 master weights and fp32 AdamW state, the forward and backward matmuls under
  ``torch.autocast(bfloat16)``, log-probs and the loss in fp32. The weights stay fp32 because a
  1e-5 update of a bf16 weight near 1 rounds away (bf16 has 8 significant bits: the smallest step
  above 1.0 is 2^-7 ≈ 0.008), so pure-bf16 AdamW at a fine-tuning learning rate mostly does nothing;
- ``bfloat16`` / ``float16``: the weights themselves in that dtype (half the memory; no master copy);
- ``auto``: ``bf16-mixed`` for a pretrained model on a device with fast bf16 (a CUDA GPU that
  supports it, a CPU with AVX-512 BF16 or AMX), else ``float32``. A CPU without them emulates bf16
  matmuls and runs them ~100× slower than fp32 (measured on an AVX2 EPYC: 1 against 109 GFLOP/s).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from mutualrl.models.weight_casts import learner_autocast

PRECISIONS = ("auto", "float32", "bf16-mixed", "bfloat16", "float16")
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class Precision:
    """A resolved ``model.dtype``: the parameters' dtype and the autocast dtype (None: no autocast)."""
    name: str  # float32 | bf16-mixed | bfloat16 | float16
    weights: torch.dtype
    autocast: torch.dtype | None
    why: str = ""  # how ``auto`` decided, for the run's log
    warning: str = ""  # set when the chosen precision is slow on this device (bf16 set on a CPU that emulates it)

    @property
    def exact(self) -> bool:
        """Whether sampler and learner compute the same fp32 numbers (no bf16/fp16 rounding)."""
        return self.name == "float32"

    def context(self, device: str | torch.device):
        """The autocast context of this precision on ``device`` (a no-op context for fp32 and pure dtypes)."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(device).type, dtype=self.autocast)

    def learner_context(self, device: str | torch.device):
        """The learner's forward context: as :meth:`context`, with the weights' 16-bit casts computed again for the
        backward pass instead of held through it (mutualrl.models.weight_casts)."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return learner_autocast(device, self.autocast)


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The first CPU's flags from ``/proc/cpuinfo`` (Linux; none elsewhere or where it cannot be read)."""
    if cpuinfo is None:
        if not sys.platform.startswith("linux"):
            return set()
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    line = next((x for x in cpuinfo.splitlines() if x.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def cpu_bf16_flags(cpuinfo: str | None = None) -> list[str]:
    """The CPU flags that make bf16 matmuls fast, from ``/proc/cpuinfo`` (Linux; none elsewhere)."""
    flags = cpu_flags(cpuinfo)
    return [f for f in CPU_BF16_FLAGS if f in flags]


def device_has_fast_bf16(device: str, cpuinfo: str | None = None) -> tuple[bool, str]:
    """Whether ``device`` runs bf16 matmuls faster than fp32, and why."""
    if device.startswith("cuda"):
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ok, "CUDA with bf16" if ok else "CUDA without bf16 support"
    flags = cpu_bf16_flags(cpuinfo)
    if flags:
        return True, f"CPU has {'/'.join(flags)}"
    return False, "CPU without AVX-512 BF16 or AMX (bf16 matmuls are emulated there)"


def resolve_precision(setting: str, *, pretrained: bool, device: str, cpuinfo: str | None = None) -> Precision:
    """The precision ``model.dtype: setting`` means for a policy on ``device``."""
    if setting not in PRECISIONS:
        raise ValueError(f"unknown model.dtype {setting!r}; valid: {', '.join(PRECISIONS)}")
    why = "set"
    if setting == "auto":
        if not pretrained:
            setting, why = "float32", "auto: a built model trains in fp32"
        else:
            fast, reason = device_has_fast_bf16(device, cpuinfo)
            setting, why = ("bf16-mixed" if fast else "float32"), f"auto: {reason}"
    if setting == "float32":
        return Precision("float32", torch.float32, None, why)
    warning = _slow_bf16_warning(setting, device, cpuinfo) if why == "set" else ""
    if setting == "bf16-mixed":
        return Precision("bf16-mixed", torch.float32, torch.bfloat16, why, warning)
    return Precision(setting, getattr(torch, setting), None, why, warning)


def _slow_bf16_warning(setting: str, device: str, cpuinfo: str | None) -> str:
    """Why a bf16 precision set in the config will be slow here, or "": a CPU without AVX-512 BF16 or AMX emulates
    bf16 matmuls, which a run otherwise only shows as long steps. How slow depends on the vector unit (measured on
    pair A, docs/results/real/sgt-r/README.md): with AVX-512 a bf16 matmul runs at ~1/3 of fp32's speed and a run
    took 1 h 25 min against 50-65 min on AVX-512 BF16; on an AVX2-only CPU SmolLM2's first step took 413 s against
    21 s."""
    if setting not in ("bf16-mixed", "bfloat16") or not device.startswith("cpu"):
        return ""
    fast, reason = device_has_fast_bf16(device, cpuinfo)
    if fast:
        return ""
    cost = ("expect steps a few times slower than float32's on this CPU (its AVX-512 emulates bf16 at ~1/3 of "
            "float32's matmul speed)" if "avx512f" in cpu_flags(cpuinfo) else
            "expect steps many times slower than float32 (~20x those of a CPU with AVX-512 BF16)")
    return f"model.dtype {setting} on a {reason}: {cost}; model.dtype float32, or auto, which picks float32 here"
