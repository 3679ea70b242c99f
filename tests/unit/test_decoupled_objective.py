"""The decoupled objective for stale rollouts (docs/algorithms.md §6) against hand-computed values."""

import math

import pytest
import torch

from mutualrl.grpo import (
    behaviour_weights,
    decoupled_policy_loss,
    gspo_loss,
    ppo_clip_loss,
    sequence_behaviour_weights,
)

LN = math.log


def _x(values):
    return torch.tensor([[LN(v) for v in values]])


def test_token_weights_are_truncated_at_the_cap_and_counted():
    # π_prox/π_b = 0.4/0.1 = 4 (truncated to 2), 0.4/0.5 = 0.8; the third token is masked out
    w, truncated = behaviour_weights(_x([0.4, 0.4, 0.9]), _x([0.1, 0.5, 0.1]), torch.tensor([[1.0, 1.0, 0.0]]), 2.0)
    assert w[0, :2].tolist() == pytest.approx([2.0, 0.8])
    assert truncated.item() == pytest.approx(0.5)


def test_decoupled_loss_hand_computed():
    # tokens: π_θ = 0.5, 0.4; π_prox = 0.4, 0.4; π_b = 0.2, 0.5; Â = 1; ε = 0.2 / 0.28; cap 1.5
    # r_θ = 1.25, 1.0 (both inside the clip); w = min(2, 1.5) = 1.5, 0.8
    # L = −(1.5·1.25 + 0.8·1.0) / 2 = −1.3375 (token mean)
    logp = _x([0.5, 0.4]).requires_grad_()
    out = decoupled_policy_loss(ppo_clip_loss, logp, _x([0.4, 0.4]), _x([0.2, 0.5]), torch.tensor([1.0]),
                                torch.ones(1, 2), is_cap=1.5, clip_low=0.2, clip_high=0.28, loss_agg="token-mean")
    assert out.loss.item() == pytest.approx(-1.3375)
    assert out.metrics["is_truncated_frac"].item() == pytest.approx(0.5)
    assert out.metrics["is_weight_mean"].item() == pytest.approx((1.5 + 0.8) / 2)
    out.loss.backward()
    # ∂L/∂log π_θ = −w Â r_θ / 2 per token (unclipped)
    assert logp.grad[0].tolist() == pytest.approx([-1.5 * 1.25 / 2, -0.8 * 1.0 / 2])


def test_the_clip_is_anchored_at_the_proximal_policy_not_the_sampler():
    # π_θ/π_b = 2 would be clipped against the sampler; against π_prox (= π_θ) the ratio is 1: no clip
    logp = _x([0.4])
    out = decoupled_policy_loss(ppo_clip_loss, logp, _x([0.4]), _x([0.2]), torch.tensor([1.0]), torch.ones(1, 1),
                                is_cap=4.0, clip_low=0.2, clip_high=0.28)
    assert out.metrics["clip_frac"].item() == 0.0
    assert out.loss.item() == pytest.approx(-2.0)  # −w·r·Â = −2·1·1


def test_negative_advantage_dual_clip_scales_with_the_weight():
    # Â = −1, r_θ = 5 (> c = 3): the dual clip caps the per-token loss at −Â·c = 3; scaled by w = 0.5 → 1.5
    out = decoupled_policy_loss(ppo_clip_loss, _x([0.5]), _x([0.1]), _x([0.2]), torch.tensor([-1.0]),
                                torch.ones(1, 1), is_cap=2.0, clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0)
    assert out.loss.item() == pytest.approx(0.5 * 3.0)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_equal_to_the_plain_clipped_objective_when_behaviour_is_proximal(agg):
    torch.manual_seed(0)
    logp = (torch.randn(4, 6) * 0.1 - 1.0).requires_grad_()
    old = (logp.detach() + torch.randn(4, 6) * 0.3)
    adv = torch.randn(4)
    mask = (torch.rand(4, 6) > 0.2).float()
    kw = dict(clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0, loss_agg=agg, norm_len=6.0)
    plain = ppo_clip_loss(logp, old, adv, mask, **kw)
    (g_plain,) = torch.autograd.grad(plain.loss, logp)
    dec = decoupled_policy_loss(ppo_clip_loss, logp, old, old, adv, mask, is_cap=2.0, **kw)
    (g_dec,) = torch.autograd.grad(dec.loss, logp)
    assert dec.loss.item() == pytest.approx(plain.loss.item(), abs=1e-7)
    assert torch.allclose(g_dec, g_plain, atol=1e-7)
    assert dec.metrics["is_weight_mean"].item() == pytest.approx(1.0)
    assert dec.metrics["is_truncated_frac"].item() == 0.0


def test_sequence_level_weight_for_gspo():
    # ℓ̄_prox − ℓ̄_b = mean(ln 0.4 − ln 0.2, ln 0.4 − ln 0.4) = ln 2 / 2 → w = √2 (under the cap)
    prox, behav, mask = _x([0.4, 0.4]), _x([0.2, 0.4]), torch.ones(1, 2)
    w, truncated = sequence_behaviour_weights(prox, behav, mask, 2.0)
    assert w.tolist() == pytest.approx([math.sqrt(2)])
    assert truncated.item() == 0.0
    logp = prox.clone().requires_grad_()  # s_i = 1: inside the clip
    out = decoupled_policy_loss(gspo_loss, logp, prox, behav, torch.tensor([1.0]), mask, is_cap=2.0,
                                sequence_level=True)
    assert out.loss.item() == pytest.approx(-math.sqrt(2))
    same = decoupled_policy_loss(gspo_loss, logp, prox, prox, torch.tensor([1.0]), mask, sequence_level=True)
    assert same.loss.item() == pytest.approx(gspo_loss(logp, prox, torch.tensor([1.0]), mask).loss.item())


def test_bad_settings_are_refused():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="is_cap must be > 1"):
        decoupled_policy_loss(ppo_clip_loss, x, x, x, torch.zeros(1), torch.ones(1, 2), is_cap=1.0)
    with pytest.raises(ValueError, match="one advantage per sequence"):
        decoupled_policy_loss(gspo_loss, x, x, x, torch.zeros(1, 2), torch.ones(1, 2), sequence_level=True)
