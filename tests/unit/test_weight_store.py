"""The weight store: directory round trip, checksum, cleanup only after acknowledgement."""

import pytest


def test_weight_store_directory_roundtrip_and_cleanup(tmp_path):
    import torch

    from mutualrl.weights import WeightStore

    store = WeightStore(tmp_path, keep=2)
    w = torch.randn(3, 3)
    state = {"embed.weight": w, "lm_head.weight": w}  # tied: the same tensor twice
    uris = [store.put("a", v, state)[0] for v in (1, 2, 3)]
    uri, checksum = store.put("a", 4, state)
    got = store.get(uri, checksum)
    # written once, as a Hugging Face checkpoint of a tied model is: the engine's module ties the head again
    assert set(got) == {"embed.weight"} and torch.equal(got["embed.weight"], w)
    store.acknowledge("a", 4)
    assert not any((tmp_path / "a" / f"v{v}").exists() for v in (1, 2))
    assert (tmp_path / "a" / "v3").exists() and (tmp_path / "a" / "v4").exists()
    with pytest.raises(ValueError, match="checksum"):
        store.get(uri, "0" * 64)
    with pytest.raises(FileNotFoundError):
        store.get(uris[0])
