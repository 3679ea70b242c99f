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


def _tied_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True))


@pytest.mark.parametrize("where", ["directory", "in-process"])
def test_a_version_streams_into_an_engines_tensors_and_a_bad_one_leaves_them_as_they_were(tmp_path, where):
    """``load_into`` copies a version into the served module tensor by tensor (no second copy of the model); every
    check runs before the first write, so a corrupt or misfitting version changes nothing the engine serves."""
    import torch

    from mutualrl.weights import WeightStore

    learner, engine = _tied_llama(), _tied_llama()
    with torch.no_grad():
        for p in learner.parameters():
            p.add_(torch.randn_like(p))
    store = WeightStore(tmp_path if where == "directory" else None)
    uri, checksum = store.put("a", 1, learner.state_dict())
    store.load_into(uri, checksum, engine.state_dict())
    for (k, a), b in zip(learner.state_dict().items(), engine.state_dict().values()):
        assert torch.equal(a, b), k
    assert engine.lm_head.weight.data_ptr() == engine.model.embed_tokens.weight.data_ptr()  # still tied

    served = {k: v.clone() for k, v in engine.state_dict().items()}
    uri2, checksum2 = store.put("a", 2, {k: v + 1 for k, v in learner.state_dict().items()})
    with pytest.raises(ValueError, match="checksum"):
        store.load_into(uri2, "0" * 64, engine.state_dict())
    uri3, checksum3 = store.put("a", 3, {**learner.state_dict(),
                                         "model.norm.weight": torch.ones(17)})
    with pytest.raises(ValueError, match="do not fit"):
        store.load_into(uri3, checksum3, engine.state_dict())
    uri4, checksum4 = store.put("a", 4, {**learner.state_dict(), "extra.weight": torch.ones(2)})
    with pytest.raises(ValueError, match="unexpected"):
        store.load_into(uri4, checksum4, engine.state_dict())
    for k, v in engine.state_dict().items():
        assert torch.equal(v, served[k]), f"{k} changed by a refused version"
    store.load_into(uri2, checksum2, engine.state_dict())
    assert torch.equal(engine.model.norm.weight, learner.model.norm.weight + 1)
