"""A safetensors file read one tensor at a time with ordinary reads.

Why not ``safetensors.safe_open``: it maps the whole file, and every page of it a reader touches stays in the
reading process's resident memory until the file is closed. A rollout service copying a 2.5 GB version into its
engine tensor by tensor so held the whole file beside its weights (5.5 GiB resident for the 0.5B Qwen, of which
3.1 GiB were its own tensors: docs/results/real/pair-memory.md). Read with ``readinto``, a tensor's bytes pass
through one buffer of that tensor's size; the file's pages stay in the page cache, which is not the process's.

The format (https://github.com/huggingface/safetensors, "Format"): 8 bytes, little-endian, the header's length
N; N bytes of JSON, {name: {dtype, shape, data_offsets: [begin, end]}} plus an optional ``__metadata__``; then
the data, offsets counted from its start."""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


class TensorFile:
    """An open safetensors file: its tensors' names and shapes from the header, each tensor read on demand."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._f = open(self.path, "rb")
        try:
            size = os.fstat(self._f.fileno()).st_size
            raw = self._f.read(8)
            if len(raw) < 8:
                raise ValueError("shorter than its header length")
            (n,) = struct.unpack("<Q", raw)
            if n > size - 8:
                raise ValueError(f"header length {n} is past the end of the file ({size} bytes)")
            header = json.loads(self._f.read(n))
            header.pop("__metadata__", None)
            self._base = 8 + n
            self._entries: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
            for name, e in header.items():
                begin, end = e["data_offsets"]
                dtype = DTYPES.get(e["dtype"])
                if dtype is None:
                    raise ValueError(f"tensor {name!r} has dtype {e['dtype']}, which this reader does not know")
                if not 0 <= begin <= end <= size - self._base:
                    raise ValueError(f"tensor {name!r} lies outside the file")
                self._entries[name] = (dtype, tuple(int(d) for d in e["shape"]), begin, end)
        except (ValueError, KeyError, TypeError, json.JSONDecodeError) as err:
            self._f.close()
            raise ValueError(f"{self.path}: not a readable safetensors file ({err})") from err

    def keys(self) -> list[str]:
        """The tensors' names, sorted (the order the store's checksum reads them in)."""
        return sorted(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        """Tensor ``name``'s shape, from the header alone."""
        return self._entries[name][1]

    def read(self, name: str) -> torch.Tensor:
        """Tensor ``name``, in a buffer of its own (nothing of the file stays mapped)."""
        dtype, shape, begin, end = self._entries[name]
        buf = bytearray(end - begin)
        self._f.seek(self._base + begin)
        if self._f.readinto(buf) != len(buf):
            raise ValueError(f"{self.path}: tensor {name!r} is cut short")
        t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
        if t.numel() != math.prod(shape):
            raise ValueError(f"{self.path}: tensor {name!r} holds {t.numel()} values for shape {shape}")
        return t.reshape(shape)

    def close(self) -> None:
        """Close the file."""
        self._f.close()

    def __enter__(self) -> TensorFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
