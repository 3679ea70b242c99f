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


def test_the_tensor_file_reads_what_safetensors_wrote_and_refuses_a_broken_file(tmp_path):
    import torch
    from safetensors.torch import save_file

    from mutualrl.weights.tensor_file import TensorFile

    state = {"b.bias": torch.arange(5, dtype=torch.bfloat16), "a.weight": torch.randn(4, 3),
             "c.ids": torch.tensor([[1, 2], [3, 4]], dtype=torch.int64), "d.empty": torch.zeros(0, 7)}
    path = tmp_path / "model.safetensors"
    save_file(state, str(path), metadata={"checksum": "x"})
    with TensorFile(path) as f:
        assert f.keys() == sorted(state) and f.shape("a.weight") == (4, 3)
        for k, v in state.items():
            got = f.read(k)
            assert got.dtype == v.dtype and torch.equal(got, v)
    path.write_bytes(path.read_bytes()[:-10])  # cut short: the header points past the end
    with pytest.raises(ValueError, match="not a readable safetensors file|lies outside"):
        TensorFile(path)
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        TensorFile(tmp_path / "junk.safetensors")


def test_loading_a_version_does_not_map_the_file_into_the_reader(tmp_path):
    """The rollout side's resident memory while it loads a version: its own tensors and one tensor's buffer, not
    the whole file beside them (safe_open's map kept every page it touched resident)."""
    import sys

    import torch

    from mutualrl.runtime.memory import StagePeaks
    from mutualrl.weights import WeightStore

    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    store = WeightStore(tmp_path)
    state = {f"layer{i}.weight": torch.randn(1024, 1024) for i in range(64)}  # 256 MiB in 64 tensors of 4 MiB
    uri, checksum = store.put("a", 1, state)
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    del state
    peaks = StagePeaks()
    peaks.enter("before")
    peaks.enter("load")
    store.load_into(uri, checksum, target)
    peaks.enter(None)
    assert peaks.peaks["load"] - peaks.peaks["before"] < 0.1  # GiB: well under the file's 0.25
    assert torch.equal(target["layer3.weight"], store.get(uri)["layer3.weight"])
