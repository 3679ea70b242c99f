"""tools/make_sums_jsonl.py: the three-term sums whose last step is a two-term sum of pair A's range, and the
committed data files are what the tool writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "examples" / "real" / "sharing" / "data"


@pytest.fixture(scope="module")
def tool(load_script):
    return load_script("tools/make_sums_jsonl.py")


def test_every_problem_leaves_a_last_step_within_the_bounds(tool):
    rows = tool.three_term_sums(400, max_partial=20, max_term=9, seed=3)
    terms = [tuple(map(int, re.findall(r"\d+", r["prompt"]))) for r in rows]
    assert len(set(terms)) == 400  # distinct
    assert all(a >= 1 and b >= 1 and a + b <= 20 and 1 <= c <= 9 for a, b, c in terms)
    assert all(int(r["answer"]) == sum(t) for r, t in zip(rows, terms))
    steps = tool.three_term_sums(400, max_partial=20, max_term=9, seed=3, last_step=True)
    assert [s["answer"] for s in steps] == [r["answer"] for r in rows]  # the same problems, in the same order
    assert all(s["prompt"] == f"Calculate {a + b} + {c}." for s, (a, b, c) in zip(steps, terms))
    with pytest.raises(ValueError, match="distinct problems exist"):
        tool.three_term_sums(10_000, max_partial=5, max_term=3, seed=0)


@pytest.mark.parametrize("name, last_step", [("sum3-partial99.jsonl", False), ("sum3-partial99-last-step.jsonl", True)])
def test_the_committed_files_are_the_tools_defaults(tool, name, last_step):
    rows = [json.loads(line) for line in (DATA / name).read_text().splitlines()]
    assert rows == tool.three_term_sums(1500, 99, 99, 0, last_step)
