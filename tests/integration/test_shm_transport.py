"""The shared-memory weight transport's own guarantees (libs/weights/src/mutualrl/weights/shm.py): a version read
while the learner rewrote its slot is refused as superseded, a /dev/shm too small for two slots is one clear error,
a killed learner's slots are reclaimed by the next start, and an engine follows a restarted learner's new slots.
Real processes and real files (in a temporary directory standing in for /dev/shm)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from mutualrl.weights.shm import HEADER_BYTES, ShmReceiver, ShmSender, VersionSuperseded, reclaim


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g).to(torch.bfloat16)}


def _publish(sender, version, state):
    got = {}
    sender.publish("p", version, state, lambda uri, checksum, manifest: got.update(uri=uri, checksum=checksum,
                                                                                    manifest=manifest))
    return got


def test_versions_alternate_between_two_slots_and_a_superseded_one_is_refused(tmp_path):
    sender, receiver = ShmSender(tmp_path / "w", "p", directory=tmp_path), ShmReceiver()
    a1 = _publish(sender, 1, _state(1))
    a2 = _publish(sender, 2, _state(2))
    assert a1["uri"].split("?")[0] != a2["uri"].split("?")[0]  # double-buffered
    assert torch.equal(receiver.get(a1["uri"], a1["checksum"], a1["manifest"])["w"], _state(1)["w"])
    _publish(sender, 3, _state(3))  # version 3 takes version 1's slot
    with pytest.raises(VersionSuperseded, match="holds version 3"):
        receiver.get(a1["uri"], a1["checksum"], a1["manifest"])
    got = receiver.get(a2["uri"], a2["checksum"], a2["manifest"])
    assert torch.equal(got["b"], _state(2)["b"])
    assert receiver.last_bytes > 0 and sender.last_bytes == receiver.last_bytes


def test_a_version_rewritten_while_it_is_read_is_refused(tmp_path, monkeypatch):
    """The seqlock: the sequence moved between the engine's two header reads."""
    sender, receiver = ShmSender(tmp_path / "w", "p", directory=tmp_path), ShmReceiver()
    a1 = _publish(sender, 1, _state(1))
    real = torch.Tensor.clone
    calls = []

    def clone_then_rewrite(t):
        out = real(t)
        if not calls:
            calls.append(1)
            _publish(sender, 3, _state(3))  # the learner laps the engine mid-copy
        return out

    monkeypatch.setattr(torch.Tensor, "clone", clone_then_rewrite)
    with pytest.raises(VersionSuperseded, match="while it was read"):
        receiver.get(a1["uri"], a1["checksum"], a1["manifest"])


def test_too_small_a_shared_memory_is_one_clear_error(tmp_path):
    """posix_fallocate fails (here: a file-size limit of 64 KiB, EFBIG) before anything is mapped: no SIGBUS."""
    script = textwrap.dedent(f"""
        import resource, signal, torch
        from mutualrl.weights.shm import ShmSender, ShmTooSmall
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        s = ShmSender({str(tmp_path / 'w')!r}, "big", directory={str(tmp_path)!r})
        try:
            s.publish("big", 1, {{"w": torch.zeros(1 << 20)}}, lambda *a: None)
        except ShmTooSmall as e:
            print("REFUSED", e)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "REFUSED big:" in out.stdout and "shm_size" in out.stdout and "weights.transport=filesystem" in out.stdout
    assert not list(tmp_path.glob("mutualrl-*"))  # the half-made slot is gone


def test_a_killed_learners_slots_are_reclaimed_by_the_next_start(tmp_path):
    script = textwrap.dedent(f"""
        import time, torch
        from mutualrl.weights.shm import ShmSender
        s = ShmSender({str(tmp_path / 'other-run')!r}, "q", directory={str(tmp_path)!r})
        s.publish("q", 1, {{"w": torch.ones(8)}}, lambda *a: None)
        s.publish("q", 2, {{"w": torch.ones(8)}}, lambda *a: None)
        print("READY", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        orphans = sorted(tmp_path.glob("mutualrl-*"))
        assert len(orphans) == 2
        assert reclaim(tmp_path) == []  # its learner is alive: kept
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    ShmSender(tmp_path / "w", "p", directory=tmp_path)  # another learner's start sweeps the dead one's slots
    assert not any(p.exists() for p in orphans)


def test_the_engine_follows_a_restarted_learners_new_slots(tmp_path):
    receiver = ShmReceiver()
    first = ShmSender(tmp_path / "w", "p", directory=tmp_path)
    a1 = _publish(first, 1, _state(1))
    receiver.get(a1["uri"], a1["checksum"], a1["manifest"])
    again = ShmSender(tmp_path / "w", "p", directory=tmp_path)  # the restarted learner recreates its slots
    a2 = _publish(again, 1, _state(7))  # a restored checkpoint may publish the same version number again
    assert torch.equal(receiver.get(a2["uri"], a2["checksum"], a2["manifest"])["w"], _state(7)["w"])
    again.close()
    assert not list(tmp_path.glob("mutualrl-*"))
    with pytest.raises(VersionSuperseded, match="stopped or restarted"):
        receiver.get(a2["uri"], a2["checksum"], a2["manifest"])


def test_a_tied_head_travels_once(tmp_path):
    emb = torch.randn(100, 16)
    sender = ShmSender(tmp_path / "w", "p", directory=tmp_path)
    a = _publish(sender, 1, {"embed.weight": emb, "lm_head.weight": emb, "norm": torch.ones(16)})
    assert a["manifest"].names == ("embed.weight", "norm")
    assert os.path.getsize(sender.slot_path(1)) == HEADER_BYTES + 100 * 16 * 4 + 64


def _engine_tensors(dtype=torch.float32) -> dict[str, torch.Tensor]:
    """What an engine's state dict holds for _state's names: zeros, ``w`` in the engine's sampling dtype."""
    return {"w": torch.zeros(64, 32, dtype=dtype), "b": torch.zeros(32, dtype=torch.bfloat16)}


def test_copy_into_writes_the_version_into_the_engines_own_tensors(tmp_path):
    """No whole copy in between: the engine's tensors are written in place (cast to their dtype), the same values
    as get() gives."""
    sender, receiver = ShmSender(tmp_path / "w", "p", directory=tmp_path), ShmReceiver()
    a1 = _publish(sender, 1, _state(1))
    target = _engine_tensors(torch.bfloat16)
    where = {k: v.data_ptr() for k, v in target.items()}
    assert receiver.copy_into(a1["uri"], a1["checksum"], a1["manifest"], target) == 1
    assert {k: v.data_ptr() for k, v in target.items()} == where  # written in place
    assert torch.equal(target["w"], _state(1)["w"].to(torch.bfloat16)) and torch.equal(target["b"], _state(1)["b"])
    assert receiver.last_bytes == sender.last_bytes


def test_copy_into_refuses_before_writing_anything(tmp_path):
    """A superseded version, a wrong checksum and tensors that do not fit leave the engine's weights as they were."""
    sender, receiver = ShmSender(tmp_path / "w", "p", directory=tmp_path), ShmReceiver()
    a1 = _publish(sender, 1, _state(1))
    _publish(sender, 3, _state(3))  # version 3 takes version 1's slot
    target = _engine_tensors()
    with pytest.raises(VersionSuperseded, match="holds version 3"):
        receiver.copy_into(a1["uri"], a1["checksum"], a1["manifest"], target)
    a4 = _publish(sender, 4, _state(4))
    with pytest.raises(ValueError, match="checksum mismatch"):
        receiver.copy_into(a4["uri"], "shm:4:1", a4["manifest"], target)
    wrong = {"w": torch.zeros(32, 64), "b": torch.zeros(32, dtype=torch.bfloat16)}
    with pytest.raises(ValueError, match="do not fit"):
        receiver.copy_into(a4["uri"], a4["checksum"], a4["manifest"], wrong)
    assert not target["w"].any() and not target["b"].any() and not wrong["w"].any()


def _rewrite_during_the_first_copy(monkeypatch, rewrite):
    """Run ``rewrite()`` (the learner writing its slot) right after the first tensor is copied into the engine."""
    real, done = torch.Tensor.copy_, []

    def copy_then_rewrite(t, src, *args, **kwargs):
        out = real(t, src, *args, **kwargs)
        if not done:
            done.append(1)
            rewrite()
        return out

    monkeypatch.setattr(torch.Tensor, "copy_", copy_then_rewrite)


def test_a_slot_rewritten_mid_copy_leaves_the_engine_on_the_newer_version_whole(tmp_path, monkeypatch):
    """The learner laps the engine while its tensors are being written: they hold a mix, so the newer version the
    slot then holds is copied whole, and the engine serves that one."""
    sender, receiver = ShmSender(tmp_path / "w", "p", directory=tmp_path), ShmReceiver()
    a1 = _publish(sender, 1, _state(1))
    _publish(sender, 2, _state(2))
    target = _engine_tensors()
    _rewrite_during_the_first_copy(monkeypatch, lambda: _publish(sender, 3, _state(3)))
    assert receiver.copy_into(a1["uri"], a1["checksum"], a1["manifest"], target) == 3
    assert torch.equal(target["w"], _state(3)["w"]) and torch.equal(target["b"], _state(3)["b"])


def test_a_slot_that_never_settles_is_weights_torn_which_the_handshake_does_not_serve_on(tmp_path, monkeypatch):
    """The learner died mid-write (its sequence stays odd): the engine holds a mix no version completes, and the
    error is neither a ValueError nor a RuntimeError, which the handshake would count as a refusal and go on
    serving: it ends the follower and the service restarts on whole weights."""
    from mutualrl.weights.transport import WeightsTorn

    sender, receiver = ShmSender(tmp_path / "w", "p", directory=tmp_path), ShmReceiver()
    a1 = _publish(sender, 1, _state(1))
    slot = sender._maps[1]

    def die_mid_write():
        seq, _, nbytes, pid = slot.header()
        slot.set_header(seq + 1, 0, nbytes, pid)

    _rewrite_during_the_first_copy(monkeypatch, die_mid_write)
    with pytest.raises(WeightsTorn, match="did not finish.*mix of versions"):
        receiver.copy_into(a1["uri"], a1["checksum"], a1["manifest"], _engine_tensors(), settle_s=0.2)
    assert not issubclass(WeightsTorn, (ValueError, RuntimeError))


def test_a_slot_rewritten_mid_copy_with_other_tensors_is_weights_torn_at_once(tmp_path, monkeypatch):
    """The newer version in the slot is a delta (other tensors, fewer bytes): it cannot complete the copy, and
    waiting would not help."""
    from mutualrl.weights.transport import WeightsTorn

    sender, receiver = ShmSender(tmp_path / "w", "p", directory=tmp_path), ShmReceiver()
    a1 = _publish(sender, 1, _state(1))
    _rewrite_during_the_first_copy(monkeypatch, lambda: _publish(sender, 3, {"__delta__.w": torch.zeros(8)}))
    with pytest.raises(WeightsTorn, match="other tensors"):
        receiver.copy_into(a1["uri"], a1["checksum"], a1["manifest"], _engine_tensors(), settle_s=30)
