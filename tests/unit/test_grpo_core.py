"""Hand-computed checks of the GRPO core (docs/algorithms.md §1.1) and SGT (§3.3)."""

import math

import pytest
import torch

from mutualrl.grpo import (
    RescueItem,
    agg_loss,
    group_stats,
    grpo_advantages,
    kl_penalty,
    ppo_clip_loss,
    select_rescues,
    sgt_nll,
)


def test_grpo_advantage_hand_computed():
    # group 0: rewards [1, 0, 0, 1] -> mean 0.5, std (N-1) = sqrt((4*.25)/3) = 0.57735
    # group 1: rewards [0, 0] -> mean 0, std 0 -> advantages 0
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = grpo_advantages(r, g, epsilon=1e-6)
    s = math.sqrt(1.0 / 3.0)
    expected = torch.tensor([0.5 / (s + 1e-6), -0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.5 / (s + 1e-6), 0.0, 0.0])
    assert torch.allclose(adv, expected, atol=1e-6)


def test_dr_grpo_drops_std():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    adv = grpo_advantages(r, torch.zeros(4, dtype=torch.long), norm_by_std=False)
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_group_of_one_gets_raw_reward():
    mean, std, count = group_stats(torch.tensor([1.0]), torch.tensor([7]))
    assert mean.item() == 0.0 and std.item() == 1.0 and count.item() == 1.0


def test_group_labels_need_not_be_contiguous_or_sorted():
    r = torch.tensor([1.0, 0.0, 1.0, 0.0])
    g = torch.tensor([9, 3, 3, 9])
    adv = grpo_advantages(r, g, norm_by_std=False)
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, 0.5, -0.5]))


def test_loop_equals_vectorised():
    torch.manual_seed(0)
    r = torch.randint(0, 2, (40,)).float()
    g = torch.randint(0, 5, (40,))
    adv = grpo_advantages(r, g)
    for i in range(40):
        grp = r[g == g[i]]
        if len(grp) == 1:
            exp = r[i]
        else:
            exp = (r[i] - grp.mean()) / (grp.std() + 1e-6)
        assert torch.isclose(adv[i], exp, atol=1e-5)


def test_ppo_clip_hand_computed():
    # ratio = e^{0.5} = 1.6487 for A=+1: clipped at 1+0.28 = 1.28 -> loss -1.28, clipped
    # ratio = e^{-0.5} = 0.6065 for A=-1: clip(ρ) = 0.8 -> max(0.6065, 0.8) = 0.8, clipped; dual clip 3 not active
    logp = torch.tensor([[0.5, -0.5]])
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, -1.0]])
    out = ppo_clip_loss(logp, old, adv, torch.ones(1, 2), clip_low=0.2, clip_high=0.28)
    assert out.loss.item() == pytest.approx((-1.28 + 0.8) / 2, abs=1e-5)
    assert out.metrics["clip_frac"] == pytest.approx(1.0)


def test_ppo_dual_clip_caps_negative_advantage_loss():
    # ratio = e^{3} = 20.1 with A = -1: unclipped loss 20.1, dual clip caps it at -A*c = 3
    out = ppo_clip_loss(torch.tensor([[3.0]]), torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1),
                        clip_ratio_c=3.0)
    assert out.loss.item() == pytest.approx(3.0)


def test_ppo_on_policy_gradient_is_minus_advantage():
    logp = torch.zeros(1, 3, requires_grad=True)
    out = ppo_clip_loss(logp, torch.zeros(1, 3), torch.tensor([2.0]), torch.tensor([[1.0, 1.0, 0.0]]))
    out.loss.backward()
    # token-mean over 2 tokens: d/dlogp of -(A·ρ)/2 at ρ=1 is -A/2 = -1 on unmasked tokens
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -1.0, 0.0]]))


def test_agg_modes_hand_computed():
    L = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert agg_loss(L, m, "token-mean").item() == pytest.approx(10 / 4)
    assert agg_loss(L, m, "seq-mean-token-mean").item() == pytest.approx((2.0 + 4.0) / 2)
    assert agg_loss(L, m, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert agg_loss(L, m, "seq-mean-token-sum-norm").item() == pytest.approx(10 / (2 * 3))
    with pytest.raises(ValueError, match="valid"):
        agg_loss(L, m, "bogus")


def test_kl_estimators_hand_computed():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(1.0)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5)
    # k3: exp(-1) - (-1) - 1 = 0.36788
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(-1), abs=1e-6)


def test_k3_plus_has_k3_value_and_k2_gradient():
    logp = torch.tensor([-1.0], requires_grad=True)
    v = kl_penalty(logp, torch.tensor([-2.0]), "k3+")
    v.backward()
    assert v.item() == pytest.approx(math.exp(-1), abs=1e-6)
    assert logp.grad.item() == pytest.approx(1.0)  # d/dlogp ½(logp-ref)² = logp - ref = 1


def _item(pid, n, mid):
    return RescueItem(pid, [1], list(range(n)), "peer", mid)


def test_select_rescues_gates_on_own_failures_and_keeps_shortest():
    cands = [_item("a", 5, "m1"), _item("a", 3, "m2"), _item("b", 2, "m3"), _item("c", 2, "m4")]
    own = {"a": 0, "b": 2}  # c was not sampled by the learner this step
    chosen = select_rescues(cands, own, group_size=8, gate_tau=0.0, max_per_prompt=1)
    assert [c.message_id for c in chosen] == ["m2"]  # a is all-fail -> shortest; b has successes; c unknown
    chosen = select_rescues(cands, own, group_size=8, gate_tau=0.25, max_per_prompt=2)  # threshold 2 -> b opens
    assert sorted(c.message_id for c in chosen) == ["m1", "m2", "m3"]


def test_select_rescues_dedups_identical_completions():
    cands = [RescueItem("a", [1], [4, 5], "p1", "m1"), RescueItem("a", [1], [4, 5], "p2", "m2")]
    assert len(select_rescues(cands, {"a": 0}, 8, 0.0, max_per_prompt=2)) == 1


def test_sgt_nll_is_length_normalised_mean():
    # seq 1: logps [-1, -3] -> 2; seq 2: [-4] -> 4; mean 3
    logp = torch.tensor([[-1.0, -3.0], [0.0, -4.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    assert sgt_nll(logp, mask).item() == pytest.approx(3.0)
    assert sgt_nll(torch.zeros(0, 3), torch.zeros(0, 3)).item() == 0.0
