"""The learner's mixed-precision forward (mutualrl.models.weight_casts): weight casts are not held through the
backward pass, and nothing it computes changes — log-probs and gradients bitwise equal to plain autocast."""

from __future__ import annotations

import contextlib

import pytest
import torch

from mutualrl.models import build_model
from mutualrl.models.families import ModelShape
from mutualrl.models.generation import sequence_logprobs
from mutualrl.models.policy import enable_activation_checkpointing
from mutualrl.models.precision import resolve_precision
from mutualrl.models.weight_casts import learner_autocast, recast_saved_weights

SHAPE = ModelShape(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_positions=64)


def saved_tensors(lean: bool, fn):
    """What autograd keeps of ``fn()``: (its result, bytes of the tensors it holds, weight casts held as references)
    — under plain bf16 autocast, or under ``learner_autocast`` (``lean``), counted by wrapping its pack hook."""
    from mutualrl.models import weight_casts as wc

    held, refs = {}, [0]
    pack = wc._pack

    def counting(t):
        out = pack(t) if lean else t
        if isinstance(out, wc._Recast):
            refs[0] += 1
        else:
            held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return out

    if lean:
        wc._pack = counting
        ctx = learner_autocast("cpu", torch.bfloat16)
    else:
        ctx = contextlib.ExitStack()
        ctx.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        ctx.enter_context(torch.autograd.graph.saved_tensors_hooks(counting, lambda t: t))
    try:
        with ctx:
            out = fn()
    finally:
        wc._pack = pack
    return out, sum(held.values()), refs[0]


@pytest.fixture
def model_and_batch(tokenizers):
    tok = tokenizers["bpe"]
    ids = {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    model = build_model("qwen2", len(tok), SHAPE, ids, seed=0)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, len(tok), (n,), generator=g).tolist() for n in (5, 9, 7)]
    completions = [torch.randint(3, len(tok), (n,), generator=g).tolist() for n in (6, 3, 8)]
    return model, prompts, completions, tok.pad_token_id


def test_learner_autocast_computes_the_same_bits_and_holds_no_weight_cast(model_and_batch):
    model, prompts, completions, pad = model_and_batch
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]

    def run(lean):
        model.zero_grad(set_to_none=True)
        (logp, _), held, refs = saved_tensors(lean, lambda: sequence_logprobs(model, prompts, completions,
                                                                               pad_id=pad))
        logp.sum().backward()
        return logp.detach(), [p.grad.clone() for p in model.parameters()], held, refs

    plain, lean = run(False), run(True)
    assert torch.equal(plain[0], lean[0])
    assert all(torch.equal(a, b) for a, b in zip(plain[1], lean[1]))
    assert plain[3] == 0 and lean[3] == len(linears)  # every linear layer's weight (the head's too) is a reference
    weights_bf16 = sum(m.weight.numel() * 2 for m in linears)
    assert plain[2] - lean[2] >= weights_bf16  # the bf16 casts are no longer held


def test_a_weight_changed_between_forward_and_backward_raises(model_and_batch):
    model, prompts, completions, pad = model_and_batch
    with learner_autocast("cpu", torch.bfloat16):
        logp, _ = sequence_logprobs(model, prompts, completions, pad_id=pad)
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    with pytest.raises(RuntimeError, match="modified in place between the forward and the backward"):
        logp.sum().backward()


def test_casts_of_non_leaves_and_views_of_them_are_kept_as_they_are():
    x = torch.randn(4, 8, requires_grad=True)
    h = x * 2  # not a leaf: its cast is an activation, saved as autograd would
    w = torch.randn(8, 3, requires_grad=True)
    with recast_saved_weights():
        y = (h.to(torch.bfloat16) @ w.to(torch.bfloat16).t().t()).float().sum()
    y.backward()
    ref_x, ref_w = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    ((ref_x * 2).to(torch.bfloat16) @ ref_w.to(torch.bfloat16)).float().sum().backward()
    assert torch.equal(x.grad, ref_x.grad) and torch.equal(w.grad, ref_w.grad)


def test_only_the_mixed_precision_learner_context_installs_it():
    fp32 = resolve_precision("float32", pretrained=True, device="cpu")
    mixed = resolve_precision("bf16-mixed", pretrained=True, device="cpu")
    with fp32.learner_context("cpu"):
        assert not torch.is_autocast_enabled("cpu")
    with mixed.learner_context("cpu"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert not torch.is_autocast_cache_enabled()


def test_with_gradient_checkpointing_the_gradients_are_the_same(model_and_batch):
    """`model.gradient_checkpointing`: the checkpointed blocks keep their own saved-tensor hooks (they recompute in the
    backward under the forward's autocast state); the gradients equal plain autocast's with checkpointing."""
    model, prompts, completions, pad = model_and_batch
    enable_activation_checkpointing(model)
    model.train()

    def grads(ctx):
        model.zero_grad(set_to_none=True)
        with ctx:
            logp, _ = sequence_logprobs(model, prompts, completions, pad_id=pad)
        logp.sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads(torch.autocast("cpu", dtype=torch.bfloat16))
    lean = grads(learner_autocast("cpu", torch.bfloat16))
    assert all(torch.equal(a, b) for a, b in zip(plain, lean))
