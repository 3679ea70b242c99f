"""Giving freed memory back to the operating system.

glibc's allocator keeps what a process frees for its own later use: after a policy's model is loaded, evaluated and
dropped (the `up` launcher), or after a learner's update frees its activations, the process still holds its
high-water mark, and on a host that runs several services beside each other that is memory no other process can
have. ``malloc_trim(0)`` returns the free pages at the top of the heap and every wholly free page inside it. It
is cheap (milliseconds) next to a model load or an update, and a no-op where glibc is not the allocator."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc


@functools.cache
def _libc_trim():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # musl, macOS: no malloc_trim
        return None


def return_freed_memory(collect: bool = False) -> bool:
    """Ask the C allocator to give free pages back (after a garbage collection with ``collect``: tensors held only
    by reference cycles); True when it gave some."""
    if collect:
        gc.collect()
    trim = _libc_trim()
    if trim is None:
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))
