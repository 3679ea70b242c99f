"""Where freed memory goes: to the next tensor (:func:`reuse_freed_pages`) or back to the operating system.

glibc's allocator keeps what a process frees for its own later use: after a policy's model is loaded, evaluated and
dropped (the `up` launcher), or after a learner's update frees its activations, the process still holds its
high-water mark, and on a host that runs several services beside each other that is memory no other process can
have. ``malloc_trim(0)`` returns the free pages at the top of the heap and every wholly free page inside it. It
is cheap (milliseconds) next to a model load or an update, and a no-op where glibc is not the allocator.

It is not free for the next step, though: the pages given back are faulted in again by the next update. So a
learner trims after its update only where it shares the host with other processes (`mutualrl up`, a compose
file, a pod beside others): ``LearnerSettings.return_freed_memory``. Where one process holds every policy
(`mutualrl run`, a compare worker) nobody else could have the pages, and the trim only costs: pair A under `run`
with freed pages reused took 78.7 s a step with the trim and 49.7 s without it, at 15.3 and 15.5 GiB peak
(benchmarks/bench_malloc.py, docs/results/real/bench-malloc.md). And a learner that does share its host trims only
when memory is short there (:func:`free_memory_share` under ``LearnerSettings.trim_when_free_below``, half by
default): SmolLM2 alone under `up` trained 28.5 s a step trimming after every update and 11.4 s under `run`, its
4 GiB of activations faulted in again each step, while the pair under `up` on 24 GiB needs the trims to stay under
16 GiB (docs/results/real/pair-memory.md). ``MUTUALRL_RETURN_FREED_MEMORY`` overrides the caller's choice: ``0``
never trims (a host with memory to spare), any other value always does, short or not (the garbage collection runs
either way)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os

RETURN_FREED_MEMORY_ENV = "MUTUALRL_RETURN_FREED_MEMORY"
REUSE_FREED_PAGES_ENV = "MUTUALRL_REUSE_FREED_PAGES"
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # mallopt's parameter numbers (glibc's malloc.h)


def _switch(env: str) -> bool | None:
    """The environment variable ``env`` as a switch: False for ``0``/``false``/``no``/``off``, True for any other
    value, None where it is unset (the caller's default)."""
    value = os.environ.get(env)
    if value is None:
        return None
    return value.strip().lower() not in ("0", "false", "no", "off")


def _switched_off(env: str) -> bool:
    """True where the environment variable ``env`` is ``0``/``false``/``no``/``off`` (unset: on)."""
    return _switch(env) is False


def _libc(symbol: str, argtypes: list):
    """The C library's ``symbol`` with its argument types, or None where there is none (musl, macOS: no
    ``malloc_trim``/``mallopt``)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = getattr(ctypes.CDLL(name), symbol)
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return fn


@functools.cache
def _libc_trim():
    return _libc("malloc_trim", [ctypes.c_size_t])


@functools.cache
def _libc_mallopt():
    return _libc("mallopt", [ctypes.c_int, ctypes.c_int])


def reuse_freed_pages() -> bool:
    """Have the C allocator hand a freed tensor's pages to the next tensor instead of back to the kernel; True when
    glibc took the settings. Called once at process start, before the first model is built.

    Why: glibc serves each allocation over its mmap threshold (128 KiB, rising to at most 32 MiB) with a fresh
    ``mmap`` and unmaps it at ``free``. On the CPU nearly every tensor an op makes is that large (a layer's
    activations, a micro-batch's logits: 49,152 columns a token for SmolLM2), so each op receives new zero pages,
    and the kernel takes one page fault per 4 KiB to give them. On our 2-core VM that was as much system time as
    compute time (``benchmarks/bench_malloc.py``). With ``mmap`` off for allocations (``M_MMAP_MAX`` 0) and the
    heap's automatic trim off (``M_TRIM_THRESHOLD`` at its maximum), large tensors come from the heap and a freed
    one's pages, already mapped, serve the next.

    The host still gets memory back where the code asks for it: :func:`return_freed_memory` (after the update of
    a learner that shares its host, after a policy's model is dropped) calls ``malloc_trim``, which releases free
    pages whatever the threshold. Where ``mmap`` cannot be avoided (the heap cannot grow), glibc still falls back to
    it. A no-op returning False where glibc is not the allocator or ``MUTUALRL_REUSE_FREED_PAGES`` is
    ``0``/``false``/``no``/``off`` (glibc's own defaults: the baseline of the benchmark)."""
    if _switched_off(REUSE_FREED_PAGES_ENV):
        return False
    mallopt = _libc_mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def _read_int(path: str) -> int | None:
    """The integer in a one-line kernel file (a cgroup's ``memory.max``), None where it is absent, unreadable or
    not a number (``max``: no limit)."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def host_meminfo(proc: str = "/proc/meminfo") -> dict[str, int]:
    """The host's memory counters from ``/proc/meminfo`` in bytes (``MemTotal``, ``MemAvailable``, ...); empty
    where it cannot be read (another OS)."""
    try:
        with open(proc) as f:
            return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f if ":" in line)}
    except (OSError, ValueError):
        return {}


def free_memory_share(proc: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup") -> float | None:
    """The share of the memory this process may use that is still free: the host's ``MemAvailable / MemTotal``,
    or, inside a cgroup with a limit (a container, a Kubernetes pod: cgroup v2's ``memory.max`` and
    ``memory.current``, v1's ``memory/memory.limit_in_bytes`` and ``memory/memory.usage_in_bytes``), its
    ``(limit - usage) / limit`` where that is smaller. A cgroup's usage counts its page cache, which the kernel
    could reclaim, so the share errs towards short (a trim too many, never one too few). None where neither says.

    Why the cgroup: a pod's limit, not the node's free memory, is what gets the learner killed."""
    shares = []
    info = host_meminfo(proc)
    if info.get("MemTotal"):
        shares.append(info.get("MemAvailable", 0) / info["MemTotal"])
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        limit = _read_int(os.path.join(cgroup, limit_file))
        usage = _read_int(os.path.join(cgroup, usage_file))
        if limit and usage is not None and limit < 2**60:  # v1 writes "no limit" as a huge number
            shares.append(max(0.0, (limit - usage) / limit))
            break
    return min(shares) if shares else None


def return_freed_memory(collect: bool = False, default: bool = True, free_below: float | None = None) -> bool:
    """Ask the C allocator to give free pages back (after a garbage collection with ``collect``: tensors held only
    by reference cycles); True when it gave some. ``default`` says whether to trim at all (a learner alone in its
    process trims, one beside the other policies in `run` does not), and ``free_below`` whether only when memory is
    short: when :func:`free_memory_share` is under it (None: whatever is free; where the share cannot be read, the
    trim happens). ``MUTUALRL_RETURN_FREED_MEMORY`` overrides both (``0``/``false``/``no``/``off``: never, any other
    value: always). False, without trimming, where it does not."""
    if collect:
        gc.collect()
    wanted = _switch(RETURN_FREED_MEMORY_ENV)
    if wanted is False or (wanted is None and not default):
        return False
    if wanted is None and free_below is not None:
        share = free_memory_share()
        if share is not None and share >= free_below:
            return False  # memory to spare: the next update reuses these pages instead of faulting them in
    trim = _libc_trim()
    if trim is None:
        return False
    return bool(trim(0))


def reset_peak_resident() -> bool:
    """Start a new peak of this process's resident memory (Linux: ``5`` to ``/proc/self/clear_refs`` resets
    VmHWM); False where that cannot be done (another OS, a kernel or sandbox that refuses the write)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_resident_bytes() -> int | None:
    """This process's peak resident memory since it started or since :func:`reset_peak_resident` (VmHWM);
    None where /proc does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class StagePeaks:
    """The process's peak resident memory in each stage of a step: where a learner's memory goes (the update's
    gradients and activations, a version being written), read from the kernel rather than estimated. Stages are
    consecutive: each :meth:`enter` closes the stage before it. In a process that runs several policies at once
    (`mutualrl run`) a stage's peak is the whole process's while that stage ran."""

    def __init__(self) -> None:
        self.enabled = True  # until the kernel refuses a reset
        self.peaks: dict[str, float] = {}
        self._stage: str | None = None

    def enter(self, stage: str | None) -> None:
        """Close the current stage (its peak, GiB) and start ``stage`` (None: only close)."""
        if not self.enabled:
            return
        if self._stage is not None:
            peak = peak_resident_bytes()
            if peak is not None:
                self.peaks[self._stage] = round(peak / 2**30, 3)
        self._stage = stage
        if stage is not None:
            self.enabled = reset_peak_resident()
