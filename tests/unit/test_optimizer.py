"""AdamW with bf16 moments and stochastic rounding (mutualrl.models.optimizer, docs/algorithms.md §7.4)."""

from __future__ import annotations

import pytest
import torch
import yaml

from mutualrl.config import ConfigError, parse_config
from mutualrl.models.optimizer import AdamWBf16State, make_optimizer, stochastic_round_bf16


def test_values_bf16_holds_exactly_never_move():
    x = torch.tensor([1.0, -2.5, 0.0, 3.0e-5, -7.0e8]).to(torch.bfloat16).float()
    for seed in range(5):
        assert torch.equal(stochastic_round_bf16(x, torch.Generator().manual_seed(seed)).float(), x)


def test_rounding_lands_on_a_neighbour_and_is_unbiased():
    # 1 + 2^-10 lies a quarter of the way from 1 to the next bf16 value (1 + 2^-7 ... spacing 2^-7 at 1)
    for x0 in (1.0 + 2**-10, -(1.0 + 2**-10), 3.3e-3):
        x = torch.full((200_000,), x0)
        r = stochastic_round_bf16(x, torch.Generator().manual_seed(0)).float()
        down = torch.tensor(x0).to(torch.bfloat16).float()  # round-to-nearest gives one neighbour
        neighbours = set(r.unique().tolist())
        assert len(neighbours) == 2 and down.item() in neighbours
        assert r.mean().item() == pytest.approx(x0, rel=2e-4)  # nearest rounding is off by ~2^-10 here


def test_a_slow_ema_freezes_under_nearest_rounding_and_not_under_stochastic():
    """v <- 0.999 v + 0.001 g^2 from v = 1 towards 4: each increment is under half a bf16 spacing."""
    g2 = torch.full((20_000,), 4.0)
    exact = torch.ones(20_000)
    nearest = torch.ones(20_000, dtype=torch.bfloat16)
    stochastic = torch.ones(20_000, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    for _ in range(500):
        exact = exact * 0.999 + 0.001 * g2
        nearest = (nearest.float() * 0.999 + 0.001 * g2).to(torch.bfloat16)
        stochastic = stochastic_round_bf16(stochastic.float() * 0.999 + 0.001 * g2, gen)
    assert nearest.float().mean().item() == pytest.approx(1.0)  # frozen at its start
    assert stochastic.float().mean().item() == pytest.approx(exact.mean().item(), rel=0.01)


def _params(seed=0):
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(64, 48)), torch.nn.Parameter(torch.randn(48))]


def test_it_follows_torchs_adamw_to_bf16_precision_over_steps():
    ours, ref = _params(), _params()
    a = AdamWBf16State(ours, lr=1e-2, weight_decay=0.1)
    b = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1)
    start = [p.detach().clone() for p in ref]
    for step in range(20):
        torch.manual_seed(100 + step)
        grads = [torch.randn_like(p) for p in ref]
        for p, q, g in zip(ours, ref, grads):
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
    for p, q, p0 in zip(ours, ref, start):
        moved = (q - p0).abs().mean()
        assert (p - q).abs().mean() < 0.02 * moved  # within 2 % of how far AdamW moved them
    st = a.state[ours[0]]
    assert st["exp_avg"].dtype == st["exp_avg_sq"].dtype == torch.bfloat16 and int(st["step"]) == 20


def test_its_state_is_half_of_adamws():
    ours, ref = _params(), _params()
    for p in [*ours, *ref]:
        p.grad = torch.ones_like(p)
    a, b = AdamWBf16State(ours), torch.optim.AdamW(ref)
    a.step()
    b.step()

    def nbytes(opt):
        return sum(v.numel() * v.element_size() for s in opt.state.values() for k, v in s.items() if k != "step")
    assert nbytes(a) == 4 * sum(p.numel() for p in ours)  # two bf16 moments: 4 bytes a parameter
    assert nbytes(a) * 2 == nbytes(b)


def test_found_inf_skips_the_whole_update():
    ps = _params()
    opt = AdamWBf16State(ps, lr=0.1)
    for p in ps:
        p.grad = torch.ones_like(p)
    opt.step()
    before = [p.detach().clone() for p in ps]
    state = {k: v.clone() for k, v in opt.state[ps[0]].items()}
    opt.found_inf = torch.tensor(1.0)
    opt.step()
    assert all(torch.equal(p, q) for p, q in zip(ps, before))
    assert all(torch.equal(v, opt.state[ps[0]][k]) for k, v in state.items())
    opt.found_inf = torch.tensor(0.0)
    opt.step()
    assert not torch.equal(ps[0], before[0]) and int(opt.state[ps[0]]["step"]) == 2


def test_a_resumed_optimizer_continues_bit_for_bit():
    def run(split: bool):
        ps = _params()
        opt = AdamWBf16State(ps, lr=1e-2, seed=3)
        for step in range(6):
            if split and step == 3:
                saved = opt.state_dict()
                opt = AdamWBf16State(ps, lr=1e-2, seed=3)
                opt.load_state_dict(saved)
            torch.manual_seed(step)
            for p in ps:
                p.grad = torch.randn_like(p)
            opt.step()
        return [p.detach().clone() for p in ps]
    assert all(torch.equal(a, b) for a, b in zip(run(False), run(True)))


def test_large_tensors_are_updated_in_slices_like_small_ones(monkeypatch):
    import mutualrl.models.optimizer as optimizer

    def run(chunk):
        monkeypatch.setattr(optimizer, "CHUNK", chunk)
        ps = _params()
        opt = AdamWBf16State(ps, lr=1e-2)
        for p in ps:
            p.grad = torch.full_like(p, 0.5)
        opt.step()
        return [p.detach().clone() for p in ps]
    whole, sliced = run(1 << 22), run(100)
    assert all(torch.allclose(a, b) for a, b in zip(whole, sliced))


def test_the_setting_is_chosen_by_config_and_refused_where_it_cannot_work():
    assert isinstance(make_optimizer(_params(), lr=1e-3, weight_decay=0.0, state_dtype="bfloat16"), AdamWBf16State)
    assert isinstance(make_optimizer(_params(), lr=1e-3, weight_decay=0.0), torch.optim.AdamW)
    base = {"name": "t", "policies": [{"name": "a", "model": {"family": "llama"}, "tokenizer": {"kind": "char"},
                                       "optim": {"state_dtype": "bfloat16"}}]}
    assert parse_config(yaml.safe_dump(base)).policies[0].optim.state_dtype == "bfloat16"
    sharded = {**base, "policies": [{**base["policies"][0], "resources": {"learner_gpus": 2}}]}
    with pytest.raises(ConfigError, match="sharded learner"):
        parse_config(yaml.safe_dump(sharded))
    half = {**base, "policies": [{**base["policies"][0], "model": {"family": "llama", "dtype": "bfloat16"}}]}
    with pytest.raises(ConfigError, match="master weights"):
        parse_config(yaml.safe_dump(half))
    with pytest.raises(ConfigError, match="state_dtype"):
        parse_config(yaml.safe_dump({**base, "policies": [{**base["policies"][0], "optim": {"state_dtype": "int8"}}]}))
