"""The report statistics of `mutualrl compare` against hand-computed values."""

import math

import pytest

from mutualrl.runtime.compare_stats import auc, ci95, paired, pool, rollouts_to_target, t975


def test_ci95_by_hand():
    # values 1, 2, 3: mean 2, sample std 1, t(0.975, 2) = 4.303 -> half-width 4.303 / sqrt(3) = 2.4843
    r = ci95([1.0, 2.0, 3.0])
    assert r["mean"] == 2.0 and r["std"] == pytest.approx(1.0) and r["ci95"] == pytest.approx(4.303 / math.sqrt(3))
    # five seeds 10, 12, 14, 16, 18: mean 14, std sqrt(10), t(4) = 2.776 -> 2.776 * sqrt(10) / sqrt(5) = 3.9259
    assert ci95([10, 12, 14, 16, 18])["ci95"] == pytest.approx(2.776 * math.sqrt(2))
    assert ci95([5.0]) == {"mean": 5.0, "ci95": None, "n": 1, "std": None}
    assert t975(100) == 1.960
    with pytest.raises(ValueError):
        ci95([])


def test_rollouts_to_target_interpolates():
    curve = [(0, 0.2), (100, 0.4), (200, 0.8)]
    assert rollouts_to_target(curve, 0.2) == 0  # already there at the start
    assert rollouts_to_target(curve, 0.6) == pytest.approx(150.0)  # halfway from 0.4 to 0.8
    assert rollouts_to_target(curve, 0.9) is None
    assert rollouts_to_target([(200, 0.8), (0, 0.2), (100, 0.4)], 0.4) == 100  # order does not matter


def test_auc_is_mean_accuracy_over_rollouts():
    # trapezoids: (0.2+0.4)/2 * 100 + (0.4+0.8)/2 * 100 = 30 + 60 = 90 over 200 rollouts = 0.45
    assert auc([(0, 0.2), (100, 0.4), (200, 0.8)]) == pytest.approx(0.45)
    assert auc([(0, 0.3)]) == 0.3


def test_paired_differences_use_common_seeds():
    # seeds 0..2: entry - baseline = 2, 4, 6 -> mean 4, std 2, half-width 4.303 * 2 / sqrt(3)
    r = paired({0: 12, 1: 14, 2: 16, 9: 99}, {0: 10, 1: 10, 2: 10})
    assert r["mean"] == 4 and r["n"] == 3 and r["ci95"] == pytest.approx(4.303 * 2 / math.sqrt(3))


def test_pooling_summaries_equals_the_ci95_of_all_values():
    a, b, c = [0.31, 0.35, 0.29, 0.40], [0.33, 0.36, 0.30], [0.5]
    pooled = pool([ci95(a), ci95(b), ci95(c)])
    direct = ci95(a + b + c)
    for k in ("mean", "std", "ci95"):
        assert pooled[k] == pytest.approx(direct[k], rel=1e-12)
    assert pooled["n"] == 8
    # by hand: two parts {1, 3} and {5}: mean 3, squares (1-3)² + (3-3)² + (5-3)² = 8, std 2
    assert pool([ci95([1.0, 3.0]), ci95([5.0])]) == pytest.approx(
        {"mean": 3.0, "std": 2.0, "n": 3, "ci95": 4.303 * 2.0 / math.sqrt(3)})
    assert pool([ci95([2.0])])["ci95"] is None
    with pytest.raises(ValueError, match="nothing to pool"):
        pool([])
