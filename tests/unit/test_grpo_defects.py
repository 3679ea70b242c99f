"""Defects found by comparing our runs with verl's and the official HACPO code (issue 13); each
test failed before its fix."""

from __future__ import annotations

import pytest
import torch

from mutualrl.grpo import CapabilityTracker
from mutualrl.grpo.aggregation import agg_loss
from mutualrl.grpo.gspo import gspo_loss, gspo_token_loss


def test_gspo_token_has_no_gradient_where_the_sequence_log_ratio_is_clamped():
    # log-probs 12 nats above the old ones: the ±10 clamp is active, so (as in GSPO) no gradient
    logp = torch.full((1, 3), -1.0, requires_grad=True)
    old = torch.full((1, 3), -13.0)
    mask = torch.ones(1, 3)
    adv = torch.tensor([-1.0])
    for loss_fn in (gspo_loss, gspo_token_loss):
        out = loss_fn(logp, old, adv, mask, clip_low=3e-4, clip_high=4e-4)
        (g,) = torch.autograd.grad(out.loss, logp)
        assert torch.count_nonzero(g) == 0, (loss_fn.__name__, g)
    # inside the clamp both still agree (value and gradient)
    logp2 = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old2 = torch.tensor([[-1.1, -1.9, -0.5]])
    a = gspo_loss(logp2, old2, torch.tensor([1.0]), mask)
    b = gspo_token_loss(logp2, old2, torch.tensor([1.0]), mask)
    (ga,) = torch.autograd.grad(a.loss, logp2)
    (gb,) = torch.autograd.grad(b.loss, logp2)
    assert torch.allclose(a.loss, b.loss) and torch.allclose(ga, gb)


def test_seq_mean_token_sum_does_not_count_empty_rows():
    # rows: token sums 3 and 5, and one empty row: mean over the two real rows = 4 (not 8/3)
    loss = torch.tensor([[1.0, 2.0], [2.0, 3.0], [7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    assert agg_loss(loss, mask, "seq-mean-token-sum") == pytest.approx(4.0)
    assert agg_loss(loss, torch.zeros_like(mask), "seq-mean-token-sum") == 0.0


def test_capability_floor_applies_to_each_batch():
    # mean reward of batch 1 is -1 (floored to 1e-8), of batch 2 is 1: window mean ~0.5, not max(1e-8, 0)
    t = CapabilityTracker(window=2, metric="reward_mean")
    t.update({"a": [-1.0, -1.0]})
    t.update({"a": [1.0, 1.0]})
    assert t.capability("a") == pytest.approx(0.5, abs=1e-7)


def test_hacpo_paper_schedule_never_mixes_sources_or_own_and_peer_rows():
    from mutualrl.services.learner.modes.hacpo import hacpo_minibatches
    from mutualrl.services.learner.objective import OWN, PEER

    kinds = [OWN] * 128 + [PEER] * 96 + [PEER] * 64
    sources = ["me"] * 128 + ["b"] * 96 + ["c"] * 64
    mbs = hacpo_minibatches(kinds, sources, 2, 2)
    assert [(s.start, s.stop) for s in mbs] == [(0, 64), (64, 128), (128, 176), (176, 224), (224, 256), (256, 288)]
    for s in mbs:
        assert len(set(sources[s])) == 1 and len(set(kinds[s])) == 1
    with pytest.raises(ValueError):
        hacpo_minibatches([PEER, OWN], ["b", "me"], 2, 2)


def test_hacpo_rows_schedule_that_would_mix_is_refused():
    from pathlib import Path

    from mutualrl.config import ConfigError, load_config

    base = Path(__file__).resolve().parents[2] / "examples" / "baselines" / "hacpo.yaml"
    with pytest.raises(ConfigError, match="would mix own and peer rows"):
        load_config(base, ["sharing.hacpo.schedule=rows", "algorithm.minibatch_rows=48"])
    assert load_config(base,
                       ["sharing.hacpo.schedule=rows", "algorithm.minibatch_rows=64"]).sharing.hacpo.schedule == "rows"
