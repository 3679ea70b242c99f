"""`mutualrl probe-hints` (app/hint_probe.py): the paired change per problem and its verdict on hand-built counts,
the hints built and refused as SGT-R builds and refuses them, the bookkeeping of a probe over a scripted receiver, and
the command end to end on two tiny built models saved as pretrained ones."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mutualrl.app.cli import app
from mutualrl.app.hint_probe import (
    HINT_KINDS,
    PLAIN,
    SgtRHints,
    Shown,
    measure,
    paired_change,
    render,
    verdict,
    writes_answer,
)
from mutualrl.config.schema import SgtRConfig
from mutualrl.tasks.answers import MASK
from mutualrl.tasks.hints import HINT_TEMPLATE
from mutualrl.tasks.verifiers import answer_verifier

K = 4


def test_the_paired_change_is_the_hinted_minus_the_plain_share_on_the_problems_that_had_a_hint():
    # three problems with a hint, one without (None): +2/4, +1/4, +2/4 of a sample share -> +41.7 points on average
    change = paired_change([3, 1, None, 2], [1, 0, 4, 0], K)
    assert change["problems"] == 3 and change["mean"] == pytest.approx(100 * (2 + 1 + 2) / (3 * K))
    assert change["ci95"] == pytest.approx(4.303 * 14.4338 / 3 ** 0.5, rel=1e-3)  # t(2) · std / √3
    assert change["verdict"] == "raises"
    assert paired_change([0, 0, 0], [2, 3, 2], K)["verdict"] == "lowers"
    assert paired_change([1, 0, 2, 1], [1, 1, 1, 1], K)["verdict"] == "no measurable change"
    assert paired_change([None, None], [1, 1], K) == {"mean": None, "ci95": None, "problems": 0, "verdict": "no hint"}
    assert paired_change([2, None], [0, 0], K)["verdict"] == "one problem"  # a mean, no interval


def _rows(**verdicts):
    return {kind: {"change": {"problems": 3 if v != "no hint" else 0, "verdict": v}} for kind, v in verdicts.items()}


def test_the_verdict_sends_a_user_to_sgt_r_only_where_a_peer_hint_raises_the_rate():
    raises = verdict(_rows(**{"peer-shortest": "no measurable change", "peer-longest": "raises"}), peer_verified=9)
    assert "raise" in raises and "peer-longest" in raises and "resample-only" in raises
    flat = verdict(_rows(**{"peer-shortest": "no measurable change", "peer-longest": "no measurable change",
                            "reference": "raises"}), peer_verified=9)  # the reference control is not SGT-R's hint
    assert "do not measurably change" in flat and "engine.temperature" in flat and "sharing.mode: sgt" in flat
    assert "lower" in verdict(_rows(**{"peer-shortest": "lowers", "peer-longest": "no measurable change"}), 3)
    assert "verified nothing" in verdict(_rows(**{k: "no hint" for k in HINT_KINDS}), peer_verified=0)
    assert "refused" in verdict(_rows(**{k: "no hint" for k in HINT_KINDS}), peer_verified=5)


def test_an_answer_counts_as_written_where_it_stands_alone_verified_or_not():
    # the step done and the ending spoilt: SmolLM2 on a hint, "91 + 88 = 179 ... The final answer is 91."
    assert writes_answer("91 + 88 = 179\n\nThe final answer is 91.", "179")
    assert writes_answer("so it is 179.", "179")  # a full stop after it is not a decimal
    assert not writes_answer("1790 and 2179", "179") and not writes_answer("179.5", "179")  # inside longer numbers
    assert not writes_answer("so it is -5", "5") and writes_answer("so it is -5", "-5")  # a sign is part of the number
    assert writes_answer("the list is [1, 2]", "[1, 2]") and not writes_answer("anything", "")


EXTRA = [HINT_TEMPLATE, MASK, "The final answer is 146."] * 20
"""Text a receiver's character vocabulary is built with beside the task's, so that it spells the hint's frame."""


def test_hints_are_masked_framed_and_refused_as_sgt_r_does_it(arithmetic_task):
    from mutualrl.models import build_tokenizer

    tok = build_tokenizer("char", arithmetic_task.corpus() + EXTRA, 300)
    verifier = answer_verifier("last_number")
    problems = arithmetic_task.train[:5]
    kept = [(f"{p.answer}", f"so the sum {p.prompt} is {p.answer}") for p in problems[:2]]
    kept += [None, ("<hint>" + problems[3].answer, "1" * 300),  # no success; a frame breaker; an over-long text
             ("so the sum is " + problems[4].answer, "SUM: " + problems[4].answer)]  # "S", "U", ":" it cannot spell
    conditions = SgtRHints(tok, kept, verifier, "last_number", SgtRConfig(max_hint_tokens=256)).conditions(True)
    assert list(conditions) == [*HINT_KINDS, "reference"]
    shortest, longest, reference = conditions.values()
    shown = longest(1, problems[1])
    assert shown.question == HINT_TEMPLATE.format(question=problems[1].prompt, hint=f"so the sum {problems[1].prompt} "
                                                  f"is {MASK}", mask=MASK)  # the answer masked, the text framed
    assert shortest(2, problems[2]) is None and longest(2, problems[2]) is None  # the peer had nothing there
    assert shortest(3, problems[3]) is None and longest(3, problems[3]) is None
    assert shortest(4, problems[4]) is not None and longest(4, problems[4]) is None
    assert dict(shortest.refused) == {"frame": 1}
    assert dict(longest.refused) == {"too_long": 1, "unspellable": 1}
    assert reference(0, problems[0]).hint == f"The final answer is {problems[0].answer}."  # the control, unmasked
    assert shortest.masked == 1 and longest.masked == 1 and reference.masked == 0  # counted where shown


def test_a_probe_counts_what_a_hint_changes_on_the_same_problems(arithmetic_task):
    """A scripted receiver that answers right only when a hint's frame is in its prompt: every hinted problem
    verifies k of k, the plain rate on the same problems is 0, and a problem with no hint is left out of the pair."""
    verifier = answer_verifier("last_number")
    problems = arithmetic_task.train[:3]
    by_prompt = {p.prompt: p for p in problems}
    asked: list[tuple[str, int, str]] = []

    def receiver(question, k, prefix=""):
        asked.append((question, k, prefix))
        base = question.split("\n\n")[0]
        right = "<hint>" in question
        return [f"{base} {by_prompt[base].answer if right else '0'}"] * k

    def hinted(i, p):
        return None if i == 2 else Shown(HINT_TEMPLATE.format(question=p.prompt, hint="12 + 30 = 42, then …",
                                                              mask=MASK), hint="12 + 30 = 42, then …")

    rows = measure(receiver, problems, verifier, "last_number", {"peer-longest": hinted}, K)
    plain, hint = rows[PLAIN], rows["peer-longest"]
    assert len(asked) == 3 + 2 and all(k == K for _, k, _ in asked)
    assert (plain["n"], plain["verified_count"], plain["by_problem"]) == (3 * K, 0, [0, 0, 0])
    assert (hint["n"], hint["verified_count"], hint["by_problem"]) == (2 * K, 2 * K, [K, K, None])
    assert hint["hints"] == 2 and hint["plain_verified_same_problems"] == 0.0
    assert hint["written"] == 2 * K  # every hinted sample writes its answer; the plain ones only where a term is it
    assert plain["written"] == K * sum(writes_answer(f"{p.prompt} 0", p.answer) for p in problems)
    assert hint["hints_with_work"] == 2  # "42" and "30" are not in the question
    assert hint["change"]["mean"] == pytest.approx(100.0) and hint["change"]["verdict"] == "raises"
    table = render({"receiver": "r", "peer": "p", "task": "arithmetic", "dataset": None,
                    "answer_format": "last_number", "problems": 3, "samples": K, "peer_verified": 0.5,
                    "peer_solved": 2, "conditions": rows, "verdict": verdict(rows, 6)})
    assert f"| peer-longest | 2 (2) | 0 | 100% | {2 * K}/{2 * K} | {2 * K}/{2 * K} | 0/{2 * K} |" in table
    assert "+100.0 ± 0.0 points per problem (raises)" in table
    for row in rows.values():  # a result written before the count still renders
        del row["written"]
    older = render({"receiver": "r", "peer": "p", "task": "arithmetic", "dataset": None, "answer_format": "last_number",
                    "problems": 3, "samples": K, "peer_verified": 0.5, "peer_solved": 2, "conditions": rows,
                    "verdict": verdict(rows, 6)})
    assert f"| peer-longest | 2 (2) | 0 | 100% | {2 * K}/{2 * K} | – | 0/{2 * K} |" in older


def _tiny_pair(tmp_path, task):
    from mutualrl.models.families import ModelShape
    from mutualrl.models.policy import load_policy

    for name, family, seed in (("r", "llama", 1), ("p", "qwen2", 2)):
        arts = load_policy(family=family, shape=ModelShape(32, 1, 4, 64, 512), tokenizer_kind="char",
                           corpus=lambda: task.corpus() + EXTRA, corpus_fingerprint=task.fingerprint() + "+hints",
                           seed=seed)
        arts.model.save_pretrained(tmp_path / name)
        arts.tokenizer.save_pretrained(tmp_path / name)
    spec = tmp_path / "pair.yaml"
    spec.write_text(f"""
name: t
policies:
  - name: receiver
    model: {{path: {tmp_path / 'r'}}}
  - name: peer
    model: {{path: {tmp_path / 'p'}}}
task: {{name: arithmetic, min_digits: 1, max_digits: 1, train_size: 40, eval_size: 16, answer_format: last_number}}
budget: {{steps: 1, max_new_tokens: 3}}
sharing: {{mode: sgt_r}}
""")
    return spec


def test_probe_hints_runs_end_to_end_on_two_tiny_models(tmp_path, arithmetic_task):
    spec = _tiny_pair(tmp_path, arithmetic_task)
    runner = CliRunner()
    bad = runner.invoke(app, ["probe-hints", str(spec), "receiver", "nobody"])
    assert bad.exit_code == 2 and "peer 'nobody' is not a policy" in bad.output
    same = runner.invoke(app, ["probe-hints", str(spec), "receiver", "receiver"])
    assert same.exit_code == 2 and "two different policies" in same.output

    out = tmp_path / "probe.json"
    res = runner.invoke(app, ["probe-hints", str(spec), "receiver", "peer", "--problems", "4", "--samples", "2",
                              "--reference", "--json", str(out), "--markdown", str(tmp_path / "probe.md")])
    assert res.exit_code == 0, res.output
    result = json.loads(out.read_text())
    rows = result["conditions"]
    assert list(rows) == [PLAIN, *HINT_KINDS, "reference"]
    assert rows[PLAIN]["n"] == 4 * 2 and len(rows[PLAIN]["by_problem"]) == 4
    solved = result["peer_solved"]
    for kind in HINT_KINDS:  # a hint on exactly the problems the peer solved, none refused by a receiver that spells
        assert rows[kind]["hints"] == solved and rows[kind]["n"] == 2 * solved and rows[kind]["refused"] == {}
    assert rows["reference"]["hints"] == 4 and rows["reference"]["masked"] == 0
    assert rows["reference"]["hints_with_work"] is None  # its number is the answer, not work
    assert result["temperature"] == {"peer": 1.0, "receiver": 1.0} and result["verdict"]
    assert "Verdict:" in res.output and (tmp_path / "probe.md").read_text().startswith("receiver ← peer")
