"""The pass-rate check's verdict at 0 passes: "may have no signal", with the pass rate the sample cannot rule out
(docs/algorithms.md, "Pass rate before RL")."""

import pytest

from mutualrl.runtime.pass_rate import NO_SIGNAL, PassRate


def _rate(problems: int, passed: int) -> PassRate:
    return PassRate("last_number", problems, passed, 1.0, 1.0, {"whole": 0.25, "boxed": 0.0})


@pytest.mark.parametrize("n, bound", [(1, 0.95), (8, 0.3123), (32, 0.0894)])
def test_zero_of_n_bounds_the_pass_rate_where_zero_passes_has_five_percent_probability(n, bound):
    pr = _rate(n, 0)
    assert pr.upper95 == pytest.approx(bound, abs=1e-4)
    # the defining property: at that rate, n misses in a row happen 5 % of the time
    assert (1 - pr.upper95) ** n == pytest.approx(0.05)


def test_a_policy_at_zero_is_summarised_with_its_bound_and_the_formats_that_would_score():
    out = _rate(8, 0).summary()
    assert out["rate"] == 0.0 and out["no_signal"] == NO_SIGNAL and "may" in NO_SIGNAL
    assert out["rate_upper95"] == 0.3123
    assert out["better_formats"] == ["whole"]


def test_a_policy_that_passes_once_gets_no_note():
    out = _rate(8, 1).summary()
    assert out["rate"] == 0.125
    assert "no_signal" not in out and "rate_upper95" not in out and "better_formats" not in out


def test_nothing_sampled_bounds_nothing():
    assert _rate(0, 0).upper95 == 1.0 and "no_signal" not in _rate(0, 0).summary()
