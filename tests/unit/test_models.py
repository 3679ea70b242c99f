"""Tokenizers of three algorithms, three model families, save/load, and exact generation log-probs."""

import pytest
import torch

from mutualrl.models import build_model, encode_completion, encode_prompt, load_policy, load_tokenizer
from mutualrl.models.families import ModelShape
from mutualrl.models.generation import cut_at_stop, sample, sequence_logprobs, stop_string_check
from mutualrl.models.policy import tokenizer_fingerprint

SHAPE = ModelShape(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_positions=64)
TEXTS = ["12+34=46", "9+9=18", "0+0=0", "99+1=100"]


@pytest.mark.parametrize("kind", ["char", "bpe", "bpe-digits", "unigram"])
def test_tokenizer_roundtrip_and_specials(tokenizers, kind):
    tok = tokenizers[kind]
    for t in TEXTS:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) == t
    assert encode_prompt(tok, "1+2=", False)[0] == tok.bos_token_id
    assert encode_completion(tok, "3")[-1] == tok.eos_token_id
    assert tok.pad_token_id is not None and tok.padding_side == "left"


def test_tokenizers_really_differ(tokenizers):
    fps = {tokenizer_fingerprint(t) for t in tokenizers.values()}
    assert len(fps) == len(tokenizers) == 4
    lens = {k: len(t("12+34=46", add_special_tokens=False)["input_ids"]) for k, t in tokenizers.items()}
    assert lens["bpe"] < lens["char"]  # BPE merged something


@pytest.mark.parametrize("kind", ["char", "bpe", "unigram"])
def test_tokenizer_save_load(tmp_path, tokenizers, kind):
    tok = tokenizers[kind]
    tok.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(tok)
    assert again("12+34=", add_special_tokens=True)["input_ids"] == tok("12+34=", add_special_tokens=True)["input_ids"]


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_model_families_build_and_are_seeded(tokenizers, family):
    tok = tokenizers["char"]
    ids = {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    a = build_model(family, len(tok), SHAPE, ids, seed=3)
    b = build_model(family, len(tok), SHAPE, ids, seed=3)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    assert a.config.model_type == family
    with pytest.raises(ValueError, match="valid: gpt2, llama, qwen2"):
        build_model("rwkv", len(tok), SHAPE, ids)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_sampled_logprobs_match_rescoring(tokenizers, family):
    """The behaviour log-probs returned by sampling equal a fresh teacher-forced forward pass,
    under left padding with prompts of different lengths — the contract PPO ratios rely on."""
    tok = tokenizers["bpe"]
    ids = {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    model = build_model(family, len(tok), SHAPE, ids, seed=0).eval()
    prompts = [encode_prompt(tok, p, False) for p in ["1+2=", "45+67=", "9+"]]
    g = torch.Generator().manual_seed(0)
    outs = sample(model, prompts, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=6, generator=g)
    with torch.no_grad():
        logp, mask = sequence_logprobs(model, prompts, [o.token_ids for o in outs], pad_id=tok.pad_token_id)
    for i, o in enumerate(outs):
        got = logp[i][mask[i].bool()]
        assert torch.allclose(got, torch.tensor(o.logprobs), atol=1e-4), (family, i)
        assert o.finish_reason in ("stop", "length")


def test_the_learner_scores_at_the_sampling_temperature_so_the_on_policy_ratio_is_one(tokenizers):
    """At T = 0.7 the sampler draws from softmax(logits / 0.7): scoring at the same T gives its log-probs back
    (ratio exp(logp - logp_old) = 1 on every token); scoring the untempered π_θ, as the learner did, does not."""
    tok = tokenizers["bpe"]
    ids = {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    model = build_model("qwen2", len(tok), SHAPE, ids, seed=1).eval()
    prompts = [encode_prompt(tok, p, False) for p in ["1+2=", "45+67=", "9+"]]
    outs = sample(model, prompts, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=6,
                  temperature=0.7, generator=torch.Generator().manual_seed(0))
    completions = [o.token_ids for o in outs]
    with torch.no_grad():
        tempered, mask = sequence_logprobs(model, prompts, completions, pad_id=tok.pad_token_id, temperature=0.7)
        raw, _ = sequence_logprobs(model, prompts, completions, pad_id=tok.pad_token_id)
    old = torch.cat([torch.tensor(o.logprobs) for o in outs])
    ratio = torch.exp(tempered[mask.bool()] - old)
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-4)
    assert (torch.exp(raw[mask.bool()] - old) - 1).abs().max() > 1e-2  # the untempered learner was off-policy


def test_greedy_is_deterministic(tokenizers):
    tok = tokenizers["char"]
    ids = {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    model = build_model("llama", len(tok), SHAPE, ids).eval()
    p = [encode_prompt(tok, "1+2=", False)]
    a = sample(model, p, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=5, temperature=0)
    b = sample(model, p, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=5, temperature=0)
    assert a[0].token_ids == b[0].token_ids


def test_built_policy_saves_and_loads_from_a_local_path(tmp_path, arithmetic_task):
    arts = load_policy(family="qwen2", shape=SHAPE, tokenizer_kind="unigram", vocab_size=200,
                       corpus=arithmetic_task.corpus, corpus_fingerprint=arithmetic_task.fingerprint(), seed=1)
    arts.model.save_pretrained(tmp_path)
    arts.tokenizer.save_pretrained(tmp_path)
    again = load_policy(path=str(tmp_path))
    assert again.fingerprint == arts.fingerprint
    assert again.source == str(tmp_path)
    for (k, v), (k2, v2) in zip(arts.model.state_dict().items(), again.model.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)


def test_built_tokenizer_is_cached_by_content(arithmetic_task):
    kw = dict(family="llama", shape=SHAPE, tokenizer_kind="bpe", vocab_size=280, corpus=arithmetic_task.corpus,
              corpus_fingerprint=arithmetic_task.fingerprint())
    a = load_policy(**kw)
    calls = []
    b = load_policy(**{**kw, "corpus": lambda: calls.append(1) or arithmetic_task.corpus()})
    assert calls == []  # second load came from the cache
    assert a.fingerprint == b.fingerprint


def test_policy_needs_exactly_one_source(tmp_path):
    with pytest.raises(ValueError, match="exactly one"):
        load_policy()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_policy(path=str(tmp_path / "empty"))


def test_loaded_policies_have_no_dropout(arithmetic_task):
    """Train-mode forward must equal eval-mode forward, or on-policy PPO ratios drift from 1."""
    arts = load_policy(family="gpt2", shape=SHAPE, tokenizer_kind="char", corpus=arithmetic_task.corpus,
                       corpus_fingerprint=arithmetic_task.fingerprint())
    tok, model = arts.tokenizer, arts.model
    p, c = [encode_prompt(tok, "1+2=", False)], [encode_completion(tok, "3")]
    model.train()
    a, _ = sequence_logprobs(model, p, c, pad_id=tok.pad_token_id)
    model.eval()
    b, _ = sequence_logprobs(model, p, c, pad_id=tok.pad_token_id)
    assert torch.allclose(a, b)


def test_a_policy_on_the_production_qwen_vocabulary():
    """tokenizer.kind qwen2.5: the real 151k vocabulary, rebuilt offline; the built model's
    embeddings cover it and a prompt + completion round-trips through it."""
    from mutualrl.config import parse_config

    arts = load_policy(family="qwen2", shape=SHAPE, tokenizer_kind="qwen2.5")
    assert len(arts.tokenizer) > 150_000
    assert arts.model.get_input_embeddings().num_embeddings >= len(arts.tokenizer)
    ids = encode_prompt(arts.tokenizer, "123+456=", False) + encode_completion(arts.tokenizer, "579")
    assert arts.tokenizer.decode(ids, skip_special_tokens=True) == "123+456=579"
    assert ids[-1] == arts.tokenizer.eos_token_id
    cfg = parse_config("name: q\npolicies: [{name: q, model: {family: qwen2}, tokenizer: {kind: qwen2.5}}]\n", "t")
    assert cfg.policies[0].tokenizer.kind == "qwen2.5"


def test_a_peers_tokenizer_loads_without_its_model(monkeypatch, tmp_path):
    """A learner needs its peers' tokenizers (THL), never their models or warm starts."""
    from pathlib import Path

    import mutualrl.models.policy as policy_mod
    from mutualrl.config import load_config
    from mutualrl.models.policy import tokenizer_fingerprint
    from mutualrl.runtime.policy_setup import build_task_from_config, peer_tokenizer

    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / "demo.yaml", ["task.train_size=500"])
    task, _ = build_task_from_config(cfg)
    p = cfg.policies[1]
    built = load_policy(family=p.model.family, shape=SHAPE, tokenizer_kind=p.tokenizer.kind,
                        vocab_size=p.tokenizer.vocab_size,
                        corpus=task.corpus, corpus_fingerprint=task.fingerprint(), cache_dir=tmp_path)

    def no_models(*a, **k):
        raise AssertionError("a peer's model was built")

    monkeypatch.setattr(policy_mod, "build_model", no_models)
    monkeypatch.setattr(policy_mod.AutoModelForCausalLM, "from_pretrained", no_models)
    tok = peer_tokenizer(cfg, 1, task, tmp_path)
    assert tokenizer_fingerprint(tok) == built.fingerprint


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_selective_logprobs_equal_the_full_log_softmax_with_gradients(dtype):
    from mutualrl.models.generation import selective_logprobs

    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 1000, generator=g) * 4).to(dtype).requires_grad_(True)
    targets = torch.randint(0, 1000, (3, 5), generator=g)
    full = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    mine = selective_logprobs(logits, targets, chunk_rows=4)  # several chunks, one ragged
    assert mine.dtype == torch.float32 and mine.shape == (3, 5)
    torch.testing.assert_close(mine, full, atol=1e-5, rtol=1e-5)
    (g_full,) = torch.autograd.grad(full.sum(), logits)
    (g_mine,) = torch.autograd.grad(mine.sum(), logits)
    torch.testing.assert_close(g_mine.float(), g_full.float(), atol=1e-5, rtol=1e-5)


def test_sample_categorical_draws_from_the_distribution():
    """Inverse-CDF sampling picks each token with its probability (and never a filtered one)."""
    from mutualrl.models.generation import sample_categorical

    p = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    logp = p.log().expand(20000, 6).contiguous()
    g = torch.Generator().manual_seed(0)
    draws = sample_categorical(logp, g)
    freq = torch.bincount(draws, minlength=6).float() / draws.numel()
    assert torch.allclose(freq, p, atol=0.015) and freq[0] == freq[2] == freq[5] == 0
    again = sample_categorical(logp, torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)  # seeded: reproducible


@pytest.mark.parametrize("kind, stops", [("char", ("+", "=9")), ("bpe", ("1+", "\n\n"))])
def test_a_generation_ended_at_a_stop_string_is_the_whole_generation_cut_there(tokenizers, kind, stops):
    """Ending a row at the token that completes a stop string gives what generating to the end and cutting at the
    first stop string (as the worker and evaluation do) gives: the same tokens, log-probs and finish reason."""
    tok = tokenizers[kind]
    ids = {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    model = build_model("llama", len(tok), SHAPE, ids, seed=5).eval()
    prompts = [encode_prompt(tok, p, False) for p in ["1+2=", "45+67=", "9+", "3"] * 4]

    def decode(x: list[int]) -> str:
        return tok.decode(x, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def draw(stop):
        return sample(model, prompts, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=24,
                      generator=torch.Generator().manual_seed(0), compact=False, stop=stop)

    whole = [cut_at_stop(decode, s, stops)[0] for s in draw(None)]
    ended = draw(stop_string_check(decode, stops))
    assert [s.token_ids for s in ended] == [s.token_ids for s in whole]
    assert [s.logprobs for s in ended] == [s.logprobs for s in whole]
    assert [s.finish_reason for s in ended] == [s.finish_reason for s in whole]
    assert sum(len(s.token_ids) for s in ended) < 24 * len(prompts)  # rows did end early


def test_a_stop_string_check_waits_for_a_stop_string_that_starts_earlier():
    pieces = {0: "xab", 1: "c", 2: "d", 3: "ef"}

    def decode(x: list[int]) -> str:
        return "".join(pieces[i] for i in x)

    holds = stop_string_check(decode, ("abcdef", "cd"))
    # "cd" is whole at token 2, but "abcdef", which starts before it, may still complete: the cut would be there
    assert not holds([0, 1]) and not holds([0, 1, 2]) and holds([0, 1, 2, 3])
    assert stop_string_check(decode, ("cd",))([0, 1, 2])
    assert stop_string_check(decode, ()) is None


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_a_shared_prefill_gives_each_row_what_the_whole_batchs_prefill_gives(tokenizers, family):
    """A prompt repeated across a group's rows is prefilled once and its cache copied to the rows: the same tokens,
    log-probs and finish reasons bit for bit as prefilling every row (prompts of different lengths, so the copies
    carry left padding), with one forward row per distinct prompt."""
    tok = tokenizers["bpe"]
    ids = {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    model = build_model(family, len(tok), SHAPE, ids, seed=3).eval()
    distinct = [encode_prompt(tok, p, False) for p in ["1+2=", "45+67=", "9+", "300+2="]]
    prompts = [p for p in distinct for _ in range(4)]
    prefill_rows = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: prefill_rows.append(kw["input_ids"].shape),
                                           with_kwargs=True)

    def draw(share: bool):
        prefill_rows.clear()
        out = sample(model, prompts, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=20,
                     temperature=1.0, generator=torch.Generator().manual_seed(0), share_prefill=share)
        return out, prefill_rows[0]

    whole, whole_prefill = draw(False)
    shared, shared_prefill = draw(True)
    hook.remove()
    assert [s.token_ids for s in shared] == [s.token_ids for s in whole]
    assert [s.logprobs for s in shared] == [s.logprobs for s in whole]
    assert [s.finish_reason for s in shared] == [s.finish_reason for s in whole]
    assert whole_prefill[0] == 16 and shared_prefill[0] == 4  # one prefill row per distinct prompt
    assert whole_prefill[1] == shared_prefill[1]  # padded to the same width
    assert len({tuple(s.token_ids) for s in shared[:4]}) > 1  # a group's rows still sample their own completions


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_a_shared_prompt_forward_gives_the_whole_forwards_logprobs_and_gradients(tokenizers, family):
    """The learner's log-probs with one forward per distinct prompt equal the whole forward's (to float rounding),
    right-aligned with the same mask, and so do the weights' gradients (a prompt position's gradient is the sum over
    the rows that share it); at a temperature, too."""
    tok = tokenizers["bpe"]
    ids = {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    model = build_model(family, len(tok), SHAPE, ids, seed=4)
    distinct = [encode_prompt(tok, p, False) for p in ["1+2=", "45+67=", "9+"]]
    prompts = [p for p in distinct for _ in range(3)] + [encode_prompt(tok, "300+2=", False)]
    g = torch.Generator().manual_seed(1)
    completions = [torch.randint(3, len(tok), (n,), generator=g).tolist() for n in [5, 1, 3, 7, 2, 2, 4, 6, 1, 3]]

    passes = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: passes.append(tuple(kw["input_ids"].shape)),
                                           with_kwargs=True)

    def run(share: bool):
        model.zero_grad()
        passes.clear()
        logp, mask = sequence_logprobs(model, prompts, completions, pad_id=tok.pad_token_id, temperature=0.7,
                                       share_prompts=share)
        (logp * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
        return logp.detach(), mask, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    whole, whole_mask, whole_grads = run(False)
    assert [rows for rows, _ in passes] == [10]
    shared, shared_mask, shared_grads = run(True)
    hook.remove()
    assert passes == [(4, passes[0][1]), (10, 7)]  # the 4 distinct prompts, then the 10 completions (longest 7)
    assert torch.equal(shared_mask, whole_mask) and whole_mask.sum() == sum(map(len, completions))
    torch.testing.assert_close(shared, whole, atol=1e-5, rtol=1e-5)
    assert whole_grads.keys() == shared_grads.keys()
    for name, grad in whole_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_under_activation_checkpointing_every_row_runs_its_whole_sequence(tokenizers):
    """Checkpointing turns the KV cache off, so the shared prompt forward steps aside for the whole one."""
    from mutualrl.models.policy import enable_activation_checkpointing

    tok = tokenizers["bpe"]
    ids = {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    model = build_model("llama", len(tok), SHAPE, ids, seed=4).train()
    enable_activation_checkpointing(model)
    passes = []
    model.register_forward_pre_hook(lambda m, a, kw: passes.append(kw["input_ids"].shape[0]), with_kwargs=True)
    prompt = encode_prompt(tok, "1+2=", False)
    logp, mask = sequence_logprobs(model, [prompt] * 3, [[5, 6], [7], [8, 9, 10]], pad_id=tok.pad_token_id,
                                   share_prompts=True)
    logp.sum().backward()
    assert passes == [3] and mask.sum() == 6
