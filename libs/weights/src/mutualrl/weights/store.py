"""Versioned weight store: learners write a version, rollout engines load it by URI.

Two backends behind one class: ``inproc://`` keeps state dicts in memory for
embedded runs; a directory stores ``<policy>/v<version>/model.safetensors`` for
multi-process runs. A version is readable only after ``put`` returns (written
to a temp name, then renamed), and old versions are deleted only when a
consumer acknowledges a newer one.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from mutualrl.weights.tensor_file import TensorFile
from mutualrl.weights.transport import Announce, TensorManifest, check_fits, checksum_of_stream, tensor_checksum, untied


def verify_checksum(uri: str, checksum: str) -> None:
    """Raise ValueError unless the checkpoint directory at ``uri`` has this checksum."""
    path = Path(uri) / "model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"no weights at {uri}")
    if tensor_checksum(load_file(str(path))) != checksum:
        raise ValueError(f"checksum mismatch for {uri}")


KEEP_VERSIONS = 2
"""Versions of a policy the filesystem store keeps once an engine serves a newer one (an engine still loading one, a
rollout still sampling with it)."""


class WeightStore:
    """The ``filesystem`` weight transport: versioned, checksummed checkpoints that learners
    publish and rollout engines load. A version's integrity is checked on its first read with a
    checksum; later reads of the same version and file skip the hash (at 7B it is ~15 GB)."""
    def __init__(self, root: str | Path | None = None, keep: int = KEEP_VERSIONS):
        self.root = Path(root) if root else None
        self.keep = keep
        self._mem: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
        self._lock = threading.Lock()
        # uri -> (checksum, what was verified: file stat or state id)
        self._verified: dict[str, tuple[str, object]] = {}

    def put(self, policy: str, version: int, state: dict[str, torch.Tensor], model_config=None) -> tuple[str, str]:
        """Store a version; returns ``(uri, checksum)``. With ``model_config`` (a transformers
        config) the directory is a complete Hugging Face checkpoint, which is what vLLM's
        ``reload_weights`` and SGLang's ``update_weights_from_disk`` read."""
        if self.root is None:  # kept in memory: a copy, or the learner's next update would change it
            cpu = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()}
            checksum = tensor_checksum(cpu)
            with self._lock:
                self._mem[(policy, version)] = cpu
            return f"inproc://{policy}/{version}", checksum
        # written before this returns (the learner steps again only after it): CPU tensors are saved as they are,
        # not copied first (a 0.5B model's fp32 weights are 2.5 GB more at the learner's peak); a tied tensor's
        # second name is dropped, as safetensors refuses shared storage and the engine's module ties it again
        cpu = {k: v.detach().to("cpu").contiguous() for k, v in untied(state).items()}
        checksum = tensor_checksum(cpu)
        final = self.root / policy / f"v{version}"
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file(cpu, str(tmp / "model.safetensors"), metadata={"checksum": checksum, "format": "pt"})
        if model_config is not None:
            model_config.save_pretrained(tmp)
        if final.exists():  # the same version written twice (a retried step): the first write stands
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, final)
        return str(final), checksum

    def publish(self, policy: str, version: int, state: dict[str, torch.Tensor], announce: Announce,
                model_config=None) -> tuple[str, str]:
        """Write the version, then announce it: a reader never sees a version that is not durable."""
        uri, checksum = self.put(policy, version, state, model_config=model_config)
        announce(uri, checksum, None)
        return uri, checksum

    def get(self, uri: str, checksum: str | None = None,
            manifest: TensorManifest | None = None) -> dict[str, torch.Tensor]:
        """A version's tensors by URI (directory or in-process), checked against ``checksum``."""
        if uri.startswith("inproc://"):
            policy, _, version = uri.removeprefix("inproc://").rpartition("/")
            with self._lock:
                state = self._mem.get((policy, int(version)))
            if state is None:
                raise FileNotFoundError(f"no weights at {uri}")
        else:
            path = Path(uri) / "model.safetensors"
            if not path.is_file():
                raise FileNotFoundError(f"no weights at {uri}")
            state = load_file(str(path))
        if checksum:
            ident = self._identity(uri, state)
            if self._verified.get(uri) != (checksum, ident):
                if tensor_checksum(state) != checksum:
                    raise ValueError(f"checksum mismatch for {uri}")
                self._verified[uri] = (checksum, ident)
        return state

    def load_into(self, uri: str, checksum: str | None, target: dict[str, torch.Tensor]) -> None:
        """Copy a stored version into ``target`` (an engine's state dict, whose tensors are its parameters) one tensor
        at a time: the rollout side holds one tensor beside its weights, not a second copy of the model. Every check
        comes first — the file's names and shapes against ``target`` (a tied head the file leaves out is the
        embedding already), then its checksum, read tensor by tensor — so a version that fails one leaves the
        served weights as they were. An in-process version is copied from the state kept in memory."""
        if uri.startswith("inproc://"):
            state = self.get(uri, checksum)
            check_fits(uri, {k: tuple(v.shape) for k, v in state.items()}, target)
            with torch.no_grad():
                for k, v in state.items():
                    target[k].copy_(v)
            return
        path = Path(uri) / "model.safetensors"
        if not path.is_file():
            raise FileNotFoundError(f"no weights at {uri}")
        with TensorFile(path) as f:  # ordinary reads: the file is never mapped into this process (tensor_file.py)
            names = f.keys()
            check_fits(uri, {k: f.shape(k) for k in names}, target)
            ident = self._identity(uri, {})
            if checksum and self._verified.get(uri) != (checksum, ident):
                if checksum_of_stream((k, f.read(k)) for k in names) != checksum:
                    raise ValueError(f"checksum mismatch for {uri}")
                self._verified[uri] = (checksum, ident)
            with torch.no_grad():
                for k in names:
                    target[k].copy_(f.read(k))

    @staticmethod
    def _identity(uri: str, state: dict[str, torch.Tensor]) -> object:
        """What a verified version is remembered by: the file's inode, size and mtime (a rewritten
        file is hashed again), or the in-memory state's identity."""
        if uri.startswith("inproc://"):
            return id(state)
        st = (Path(uri) / "model.safetensors").stat()
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def acknowledge(self, policy: str, version: int) -> None:
        """A consumer serves ``version``: versions older than the last ``keep`` may go."""
        with self._lock:
            for key in [k for k in self._mem if k[0] == policy and k[1] <= version - self.keep]:
                del self._mem[key]
        if self.root is not None and (self.root / policy).is_dir():
            for d in (self.root / policy).iterdir():
                if d.name.startswith("v") and d.name[1:].isdigit() and int(d.name[1:]) <= version - self.keep:
                    shutil.rmtree(d, ignore_errors=True)
