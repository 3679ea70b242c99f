"""GSPO, XGRPO, HACPO, PRP and SGT group-insert against hand-computed values (arithmetic in
comments), loop-versus-vectorised equivalence, and the stop-gradient behaviour each
formula specifies (docs/algorithms.md §1.2, §2, §3.3)."""

import math
import statistics

import pytest
import torch

from mutualrl.grpo import (
    CapabilityTracker,
    PeerGroupStats,
    cross_clip_lower,
    get_policy_loss,
    group_insert_advantages,
    grpo_advantages,
    gspo_loss,
    gspo_token_loss,
    hacpo_advantages,
    hacpo_loss,
    prp_peer_loss,
    xgrpo_advantages,
    xgrpo_baseline,
)

# ---------------------------------------------------------------- GSPO (§1.2)


def test_gspo_hand_computed():
    # row 0: log-ratio per token [0.1, -0.1] -> mean 0 -> s = 1; A = +1 -> objective 1
    # row 1: log-ratio [0.2, 0.0] -> mean 0.1 -> s = e^0.1 = 1.105171; A = -1
    #   unclipped s·A = -1.105171, clipped 1.0004·A = -1.0004; min = -1.105171: the pessimistic
    #   bound keeps the unclipped branch, so no row counts as clipped (verl's pg_clipfrac)
    # loss = -(1 - 1.105171) / 2 = 0.0525855
    old = torch.zeros(2, 2)
    logp = torch.tensor([[0.1, -0.1], [0.2, 0.0]], requires_grad=True)
    out = gspo_loss(logp, old, torch.tensor([1.0, -1.0]), torch.ones(2, 2))
    assert out.loss.item() == pytest.approx(0.0525855, abs=1e-6)
    assert out.metrics["clip_frac"] == 0.0
    # with A = +1 instead, s = 1.105 > 1.0004 takes the clipped branch
    assert gspo_loss(logp.detach(), old, torch.tensor([1.0, 1.0]), torch.ones(2, 2)).metrics["clip_frac"] == 0.5
    out.loss.backward()
    # row 1 uses the unclipped branch: d(-(s·A))/dlogp_t / 2 = -(-1)·s·(1/2)/2 = s/4 per token
    assert logp.grad[1].tolist() == pytest.approx([math.exp(0.1) / 4] * 2, abs=1e-6)
    # row 0: -(1/2)·s·A·(1/|y|) = -0.25 per token
    assert logp.grad[0].tolist() == pytest.approx([-0.25, -0.25], abs=1e-6)


def test_gspo_ignores_padding_and_empty_rows():
    logp = torch.tensor([[0.0, 0.3], [0.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    out = gspo_loss(logp, torch.zeros(2, 2), torch.tensor([1.0, 5.0]), mask)
    # only row 0 counts: s = e^0.3 clipped to 1.0004 for A > 0 -> loss = -1.0004
    assert out.loss.item() == pytest.approx(-1.0004, abs=1e-6)


def test_gspo_token_equals_gspo_in_value_and_gradient():
    torch.manual_seed(0)
    base = torch.randn(4, 5) * 0.01
    old = base + torch.randn(4, 5) * 0.001
    mask = torch.ones(4, 5)
    mask[1, :2] = 0
    adv = torch.tensor([0.5, -1.0, 2.0, -0.3])
    a = base.clone().requires_grad_(True)
    b = base.clone().requires_grad_(True)
    la = gspo_loss(a, old, adv, mask, clip_low=0.2, clip_high=0.2).loss
    lb = gspo_token_loss(b, old, adv, mask, clip_low=0.2, clip_high=0.2, loss_agg="seq-mean-token-mean").loss
    la.backward()
    lb.backward()
    assert la.item() == pytest.approx(lb.item(), abs=1e-7)
    assert torch.allclose(a.grad, b.grad, atol=1e-7)


def test_gspo_token_takes_per_token_advantages():
    logp = torch.zeros(1, 3, requires_grad=True)
    adv = torch.tensor([[1.0, 0.0, -1.0]])
    out = gspo_token_loss(logp, torch.zeros(1, 3), adv, torch.ones(1, 3))
    out.loss.backward()
    # s = 1, per-token objective A_t; seq-mean-token-mean -> grad = -A_t / 3
    assert logp.grad[0].tolist() == pytest.approx([-1 / 3, 0.0, 1 / 3])


def test_policy_loss_registry():
    assert get_policy_loss("gspo") is gspo_loss
    with pytest.raises(ValueError, match="valid: grpo, gspo, gspo_token"):
        get_policy_loss("ppo")


# ---------------------------------------------------------------- XGRPO (§3.3)


def _stats(samples):
    return len(samples), statistics.fmean(samples), statistics.stdev(samples) if len(samples) > 1 else 0.0


def _peers(count, mean, std, rows=4):
    """One peer's stats, the same for every row's prompt."""
    return PeerGroupStats(*(torch.full((rows, 1), float(x)) for x in (count, mean, std)))


def test_xgrpo_pooled_hand_computed():
    # own [1,0,0,0], peer [1,1,1,0]: pooled 8 samples, mean 0.5, std sqrt(8·0.25/7) = 0.534522
    # A(r=1) = 0.5/0.534522 = 0.935414; A(r=0) = -0.935414
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    g = torch.zeros(4, dtype=torch.long)
    c, m, s = _stats([1, 1, 1, 0])
    adv, base, scale = xgrpo_advantages(r, g, _peers(c, m, s), epsilon=0.0)
    assert base.tolist() == pytest.approx([0.5] * 4)
    assert scale.tolist() == pytest.approx([0.534522] * 4, abs=1e-6)
    assert adv.tolist() == pytest.approx([0.935414, -0.935414, -0.935414, -0.935414], abs=1e-6)


def test_xgrpo_all_fail_group_gets_negative_advantage_when_peers_succeed():
    r = torch.zeros(4)
    g = torch.zeros(4, dtype=torch.long)
    c, m, s = _stats([1, 1, 0, 0])
    adv, _, _ = xgrpo_advantages(r, g, _peers(c, m, s))
    assert (adv < 0).all()
    assert grpo_advantages(r, g).abs().max() == 0  # GRPO gives these nothing


def test_xgrpo_without_peers_is_grpo():
    torch.manual_seed(1)
    r = (torch.rand(24) > 0.5).float()
    g = torch.arange(24) // 8
    none = torch.zeros(24, 1)
    adv, _, _ = xgrpo_advantages(r, g, PeerGroupStats(none, none, none))
    assert torch.allclose(adv, grpo_advantages(r, g), atol=1e-6)


@pytest.mark.parametrize("variant", ["pooled", "calibrated", "leave_self_out"])
def test_xgrpo_loop_equals_vectorised(variant):
    """Reference: build the explicit list of pooled samples per row and take statistics.stdev."""
    torch.manual_seed(2)
    G, K, M = 6, 5, 2
    r = (torch.rand(G * K) > 0.6).float()
    g = torch.arange(G * K) // G
    peer_samples = [[[float(x) for x in (torch.rand(4 + j) > 0.4).tolist()] for j in range(M)] for _ in range(K)]
    peer_samples[3][1] = []  # a peer that sent nothing for prompt 3
    omega = torch.tensor([[0.5, 2.0]]).expand(G * K, M)
    cnt, mean, std = (torch.zeros(G * K, M) for _ in range(3))
    for i in range(G * K):
        for j in range(M):
            s = peer_samples[int(g[i])][j]
            if s:
                cnt[i, j], mean[i, j], std[i, j] = _stats(s)
    adv, base, scale = xgrpo_advantages(r, g, PeerGroupStats(cnt, mean, std, omega), variant=variant,
                                        epsilon=1e-6)
    for i in range(G * K):
        own = [float(r[k]) for k in range(G * K) if g[k] == g[i] and (variant != "leave_self_out" or k != i)]
        pool = list(own)
        for j in range(M):
            w = float(omega[0, j]) if variant == "calibrated" else 1.0
            pool += [w * x for x in peer_samples[int(g[i])][j]]
        b = statistics.fmean(pool)
        sd = statistics.stdev(pool)
        assert base[i].item() == pytest.approx(b, abs=1e-6)
        assert scale[i].item() == pytest.approx(sd, abs=1e-6)
        assert adv[i].item() == pytest.approx((float(r[i]) - b) / (sd + 1e-6), abs=1e-5)


def test_xgrpo_leave_self_out_baseline_does_not_depend_on_own_reward():
    g = torch.zeros(5, dtype=torch.long)
    peer = PeerGroupStats(torch.full((5, 1), 8.0), torch.full((5, 1), 0.375), torch.full((5, 1), 0.5175))
    r = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0])
    base_a, scale_a = xgrpo_baseline(r, g, peer, variant="leave_self_out")
    for i in range(5):
        flipped = r.clone()
        flipped[i] = 1.0 - flipped[i]
        base_b, scale_b = xgrpo_baseline(flipped, g, peer, variant="leave_self_out")
        assert base_b[i].item() == pytest.approx(base_a[i].item())  # row i's own baseline is unchanged
        assert scale_b[i].item() == pytest.approx(scale_a[i].item())
    # the pooled variant does depend on it (so the test above is not vacuous)
    p_a, _ = xgrpo_baseline(r, g, peer, variant="pooled")
    p_b, _ = xgrpo_baseline(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0]), g, peer, variant="pooled")
    assert p_a[0].item() != pytest.approx(p_b[0].item())


def test_xgrpo_bad_inputs():
    r = torch.zeros(2)
    g = torch.zeros(2, dtype=torch.long)
    z = torch.zeros(2, 1)
    with pytest.raises(ValueError, match="valid: pooled, calibrated, leave_self_out"):
        xgrpo_baseline(r, g, PeerGroupStats(z, z, z), variant="mixed")
    with pytest.raises(ValueError, match="peers.omega"):
        xgrpo_baseline(r, g, PeerGroupStats(z, z, z), variant="calibrated")
    with pytest.raises(ValueError, match=r"\[B, M\]"):
        xgrpo_baseline(r, g, PeerGroupStats(torch.zeros(3, 1), z, z))


# ---------------------------------------------------------------- HACPO (§2)


def test_capability_tracker_window_clip_warmup_and_state():
    t = CapabilityTracker(window=2, ratio_min=0.1, ratio_max=10)
    assert t.capability("a") == 1.0 and t.ratio("a", "b") == 1.0  # no history yet
    t.update({"a": [1, 0, 0, 0], "b": [1, 1, 1, 1]})  # a 0.25, b 1.0
    t.update({"a": [1, 1, 0, 0], "b": [0, 0, 0, 0]})  # a 0.5, b 0.0
    t.update({"a": [0, 0, 0, 0], "b": [0, 0, 0, 0]})  # window 2 keeps the last two batches
    assert t.capability("a") == pytest.approx(0.25)  # (0.5 + 0) / 2
    assert t.capability("b") == pytest.approx(1e-8)  # floored at the minimum
    assert t.ratio("a", "b") == 10.0 and t.ratio("b", "a") == 0.1  # clipped to [0.1, 10]
    clone = CapabilityTracker(window=2)
    clone.load_state_dict(t.state_dict())
    assert clone.capability("a") == t.capability("a") and clone.steps == 3
    w = CapabilityTracker(warmup_steps=1)
    w.update({"a": [1], "b": [0, 1]})
    assert w.ratio("a", "b") == 1.0  # steps (1) <= warmup (1)
    w.update({"a": [1], "b": [0, 1]})
    assert w.ratio("a", "b") == pytest.approx(2.0)
    m = CapabilityTracker(metric="reward_mean")
    m.update({"a": [0.5, 1.0, -1.0]})
    assert m.capability("a") == pytest.approx(1 / 6)
    with pytest.raises(ValueError, match="valid: positive_rate, reward_mean"):
        CapabilityTracker(metric="accuracy")


def test_hacpo_advantage_hand_computed():
    # learner k: own [1,0,0,0] (P_k 0.25); peer j: [1,1,1,0] (P_j 0.75)
    # weight on peer rows ω^(k,j) = P_k/P_j = 1/3
    # μ̂ = (1+0+0+0 + (1+1+1+0)/3) / 8 = 2/8 = 0.25 (= P_k)
    # σ_joint = std([1,0,0,0,1,1,1,0], N-1) = sqrt(2/7) = 0.534522
    # A(r=1) = 0.75/0.534522 = 1.403122; A(r=0) = -0.25/0.534522 = -0.467707 (own and peer rows alike)
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 0])
    g = torch.zeros(8, dtype=torch.long)
    is_self = torch.tensor([True] * 4 + [False] * 4)
    w = torch.tensor([1.0] * 4 + [1 / 3] * 4)
    adv, base = hacpo_advantages(r, g, w, is_self, epsilon=0.0)
    assert base.tolist() == pytest.approx([0.25] * 8)
    expect = [1.403122, -0.467707, -0.467707, -0.467707, 1.403122, 1.403122, 1.403122, -0.467707]
    assert adv.tolist() == pytest.approx(expect, abs=1e-6)


def test_hacpo_pushes_down_every_own_row_of_an_all_fail_group_that_a_peer_solved():
    """GRPO gives a group whose own rows all failed no gradient; HACPO's joint baseline does not (§2.3). Between two
    model families the peer's rows sit below the ratio's lower bound (no gradient, §2.6), so this push-down is all
    that is left on such a prompt."""
    # weak learner k: own [0,0,0,0] (P_k floored: ω^(k,j) clipped to 0.1); peer j: [1,1,0,0]
    # μ̂ = (0·4 + 0.1·(1+1+0+0)) / 8 = 0.025; σ_joint = std([0,0,0,0,1,1,0,0], N-1) = sqrt(1.5/7) = 0.462910
    # own rows: A = (0 − 0.025) / 0.462910 = −0.054006
    r = torch.tensor([0.0, 0, 0, 0, 1, 1, 0, 0])
    g = torch.zeros(8, dtype=torch.long)
    is_self = torch.tensor([True] * 4 + [False] * 4)
    adv, base = hacpo_advantages(r, g, torch.tensor([1.0] * 4 + [0.1] * 4), is_self, epsilon=0.0)
    assert base.tolist() == pytest.approx([0.025] * 8)
    assert adv[:4].tolist() == pytest.approx([-0.054006] * 4, abs=1e-6)
    own_only, _ = hacpo_advantages(r[:4], g[:4], torch.ones(4), is_self[:4])
    assert own_only.abs().max() == 0  # the same group without the peer's rows: identical rewards, no gradient


def test_hacpo_guards():
    g = torch.zeros(4, dtype=torch.long)
    is_self = torch.tensor([True, True, False, False])
    # (a) identical rewards -> plain mean -> A = 0, even with skewed weights
    adv, base = hacpo_advantages(torch.ones(4), g, torch.tensor([1.0, 1.0, 10.0, 10.0]), is_self)
    assert adv.abs().max() == 0 and base.tolist() == pytest.approx([1.0] * 4)
    # (b) weighted baseline (1·0 + 1·1 + 10·1 + 10·0)/4 = 2.75 > 1 -> own mean 0.5
    r = torch.tensor([0.0, 1.0, 1.0, 0.0])
    adv, base = hacpo_advantages(r, g, torch.tensor([1.0, 1.0, 10.0, 10.0]), is_self)
    assert base.tolist() == pytest.approx([0.5] * 4)
    _, base_off = hacpo_advantages(r, g, torch.tensor([1.0, 1.0, 10.0, 10.0]), is_self, binary_baseline_guard=False)
    assert base_off.tolist() == pytest.approx([2.75] * 4)


def test_theorem_4_1_calibrated_baseline_is_unbiased_monte_carlo():
    """Fixed capabilities, binary rewards: E[μ̂^(k)] = P_k (Thm 4.1), whereas the plain pooled mean is biased."""
    gen = torch.Generator().manual_seed(0)
    p_k, p_j, G, trials = 0.3, 0.7, 8, 20000
    own = (torch.rand(trials, G, generator=gen) < p_k).float()
    peer = (torch.rand(trials, G, generator=gen) < p_j).float()
    r = torch.cat([own, peer], 1).reshape(-1)
    g = torch.arange(trials).repeat_interleave(2 * G)
    is_self = torch.tensor(([True] * G + [False] * G) * trials)
    w = torch.where(is_self, torch.tensor(1.0), torch.tensor(p_k / p_j))
    _, base = hacpo_advantages(r, g, w, is_self, binary_baseline_guard=False)
    # guard (a) replaces the weighted mean by the plain mean on all-equal groups; those are
    # rare here (P(all 16 equal) < 1e-6), so the expectation is the weighted one
    per_prompt = base.reshape(trials, 2 * G)[:, 0]
    se = float(per_prompt.std()) / math.sqrt(trials)
    assert float(per_prompt.mean()) == pytest.approx(p_k, abs=4 * se + 1e-3)
    assert float(r.reshape(trials, -1).mean()) == pytest.approx((p_k + p_j) / 2, abs=0.01)  # the naive mean is not P_k


def test_cross_clip_lower_schedule():
    # code defaults δ 0.2, δ_step 0.025: m = 0..3 -> 0.8, 0.825, 0.85, 0.875; never above 1
    assert [cross_clip_lower(m, 0.2, 0.025) for m in range(4)] == pytest.approx([0.8, 0.825, 0.85, 0.875])
    assert cross_clip_lower(100, 0.2, 0.025) == 1.0


def _hacpo(logp, src_mean, adv, is_self, omega, **kw):
    mask = torch.ones_like(logp)
    return hacpo_loss(logp, mask, torch.tensor(src_mean), torch.tensor(adv), torch.tensor(is_self), torch.tensor(omega),
                      **kw)


@pytest.mark.parametrize("alpha", [0.0, 1.0, 3.0])
def test_hacpo_cross_gradient_is_omega_sg_s_alpha_plus_one_A_grad_mean_logp(alpha):
    # one cross row of 4 tokens, ℓ̄_k = -1.0, ℓ̄_src = -0.9 -> s = e^-0.1 = 0.904837 (inside [0.8, 1])
    logp = torch.full((1, 4), -1.0, requires_grad=True)
    omega, A = 1.7, 0.6
    out = _hacpo(logp, [-0.9], [A], [False], [omega], alpha=alpha, minibatch_index=0)
    out.loss.backward()
    s = math.exp(-0.1)
    # loss = -o; ∇o = ω·sg[s]^(α+1)·A·∇ℓ̄ and ∂ℓ̄/∂logp_t = 1/4
    expect = -omega * s ** (alpha + 1) * A / 4
    assert logp.grad[0].tolist() == pytest.approx([expect] * 4, rel=1e-5)
    # the value is c·sg[c]^α·ω·A with c = s
    assert out.loss.item() == pytest.approx(-(s ** (alpha + 1)) * omega * A, rel=1e-5)


def test_hacpo_cross_rows_below_the_stepwise_bound_get_zero_gradient():
    # s = e^-0.2 = 0.8187: inside at m = 0 (bound 0.8), discarded at m = 1 (bound 0.825)
    for m, zero in ((0, False), (1, True)):
        logp = torch.full((1, 3), -1.2, requires_grad=True)
        out = _hacpo(logp, [-1.0], [1.0], [False], [1.0], minibatch_index=m)
        out.loss.backward()
        assert (logp.grad.abs().max().item() == 0.0) is zero
        assert out.metrics["cross_discarded_frac"] == (1.0 if zero else 0.0)
    # above 1 the ratio is capped (cross rows can only down-weight): zero gradient as well
    logp = torch.full((1, 3), -0.5, requires_grad=True)
    out = _hacpo(logp, [-1.0], [1.0], [False], [1.0])
    out.loss.backward()
    assert logp.grad.abs().max().item() == 0.0 and out.loss.item() == pytest.approx(-1.0)


def test_hacpo_self_rows_are_gspo_and_kl_only_on_self_tokens():
    torch.manual_seed(3)
    logp = (torch.randn(2, 3) * 0.1 - 1).requires_grad_(True)
    src = logp.detach().mean(-1) + 1e-5  # self ratio ≈ 1
    ref = torch.full((2, 3), -2.0)
    out = hacpo_loss(logp, torch.ones(2, 3), src, torch.tensor([1.0, 0.0]), torch.tensor([True, False]),
                     torch.tensor([1.0, 1.0]),
                     ref_logp=ref, kl_coef=0.5, kl_type="k3")
    out.loss.backward()
    # the cross row has A = 0 and no KL: its gradient is exactly zero
    assert logp.grad[1].abs().max().item() == 0.0
    assert logp.grad[0].abs().max().item() > 0.0
    # self row value = GSPO's with the same clip
    g = gspo_loss(logp.detach()[:1], src[:1, None].expand(1, 3), torch.tensor([1.0]), torch.ones(1, 3))
    assert (out.loss.item() - 0.5 * out.metrics["kl"]) == pytest.approx(g.loss.item() / 2, abs=1e-6)  # mean over 2 rows


# ---------------------------------------------------------------- PRP (§3.3)


def test_prp_sequence_level_hand_computed_and_truncation():
    # row 0: ℓ̄_n = -1.0, ℓ̄_m = -1.2 -> w = e^0.2 = 1.2214 -> truncated at C=1: value 1·A
    # row 1: ℓ̄_n = -1.0, ℓ̄_m = -0.5 -> w = e^-0.5 = 0.6065 -> value w·A
    logp = torch.full((2, 2), -1.0, requires_grad=True)
    adv = torch.tensor([1.0, -2.0])
    out = prp_peer_loss(logp, torch.ones(2, 2), adv, peer_mean_logp=torch.tensor([-1.2, -0.5]), truncation=1.0)
    w1 = math.exp(-0.5)
    assert out.loss.item() == pytest.approx(-(1.0 * 1.0 + w1 * -2.0) / 2, abs=1e-6)
    assert out.metrics["peer_truncated_frac"] == 0.5
    out.loss.backward()
    # gradient min(w, C)·A·∇ℓ̄ / rows: row 0: -(1·1)/2/2 = -0.25 per token; row 1: -(w1·-2)/2/2
    assert logp.grad[0].tolist() == pytest.approx([-0.25, -0.25], abs=1e-6)
    assert logp.grad[1].tolist() == pytest.approx([w1 / 2] * 2, abs=1e-6)


def test_prp_token_level_uses_transported_logprobs_and_mask():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    peer = torch.tensor([[-1.0, -1.0, -3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # token 2 is in an unaligned THL group
    out = prp_peer_loss(logp, mask, torch.tensor([1.0]), peer_logp=peer, level="token", truncation=2.0)
    # w = [1, e^-1, (masked)] -> token-mean over 2 tokens: -(1 + 0.367879)/2
    assert out.loss.item() == pytest.approx(-(1 + math.exp(-1)) / 2, abs=1e-6)
    out.loss.backward()
    assert logp.grad[0, 2].item() == 0.0
    with pytest.raises(ValueError, match="valid: sequence, token"):
        prp_peer_loss(logp, mask, torch.tensor([1.0]), level="group")


# ---------------------------------------------------------------- SGT group insert (§3.3)


def test_sgt_group_insert_hand_computed():
    # own [0,0,0] + y* (reward 1): mean 0.25, std sqrt((3·0.0625 + 0.5625)/3) = 0.5
    # y*: 0.75/0.5 = 1.5; own failures: -0.25/0.5 = -0.5 (GRPO alone would give them 0)
    own_adv, res_adv = group_insert_advantages(torch.zeros(3), torch.zeros(3, dtype=torch.long),
                                               torch.zeros(1, dtype=torch.long), epsilon=0.0)
    assert res_adv.tolist() == pytest.approx([1.5])
    assert own_adv.tolist() == pytest.approx([-0.5] * 3)
