"""A learner checkpoint that cannot be written (a full disk) fails with a line that says where and how much room is
left, and leaves no partial file beside the previous checkpoint."""

from __future__ import annotations

import pytest


def test_a_checkpoint_that_cannot_be_written_says_where_and_leaves_no_partial_file(tmp_path, monkeypatch):
    import torch

    from mutualrl.services.learner.loop import save_state

    def full_disk(obj, f):
        with open(f, "wb") as out:
            out.write(b"partial")
        raise RuntimeError("basic_ios::clear: iostream error")

    monkeypatch.setattr(torch, "save", full_disk)
    target = tmp_path / "learner.state.pt"
    with pytest.raises(OSError, match=r"checkpoint of qwen at step 3 to .*learner.state.pt \(.* GiB free"):
        save_state(target, {"w": 1}, 3, "qwen")
    assert list(tmp_path.iterdir()) == []
