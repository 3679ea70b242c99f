"""Tasks and verifiers: seeded disjoint splits, exact verifiers, JSONL errors, math-verify off the main thread."""

import threading

import pytest

from mutualrl.tasks import Problem, build_task, build_verifier
from mutualrl.tasks.countdown import CountdownVerifier


def test_arithmetic_splits_are_seeded_and_disjoint():
    a = build_task("arithmetic", seed=1, max_digits=3, train_size=500, eval_size=50)
    b = build_task("arithmetic", seed=1, max_digits=3, train_size=500, eval_size=50)
    c = build_task("arithmetic", seed=2, max_digits=3, train_size=500, eval_size=50)
    assert [p.prompt for p in a.train] == [p.prompt for p in b.train]
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    assert not {p.prompt for p in a.train} & {p.prompt for p in a.eval}
    for p in a.train[:50]:
        x, y = p.prompt[:-1].split("+")
        assert int(x) + int(y) == int(p.answer)


def test_arithmetic_operators():
    t = build_task("arithmetic", operators="-*", train_size=200, eval_size=10)
    for p in t.train[:50]:
        assert eval(p.prompt[:-1]) == int(p.answer)  # noqa: S307 - digits and operators only
    with pytest.raises(ValueError, match="operators"):
        build_task("arithmetic", operators="/")


def test_exact_verifier():
    v = build_verifier("exact", build_task("arithmetic", train_size=10, eval_size=2))
    p = Problem("12+30=", "42")
    assert v.score(p, "42") == 1.0
    assert v.score(p, " 42 \n") == 1.0
    assert v.score(p, "43") == 0.0
    assert v.score(p, "4") == 0.0


def test_countdown_reference_answers_verify():
    t = build_task("countdown", train_size=200, eval_size=20)
    v = t.default_verifier()
    assert all(v.score(p, p.answer) == 1.0 for p in t.train[:100])


@pytest.mark.parametrize(
    "completion, ok",
    [
        ("3*5+7", 1.0),
        ("7+3*5", 1.0),
        ("(7+3)*2", 0.0),  # 2 is not among the numbers
        ("3*5+7+7", 0.0),  # 7 used twice
        ("__import__('os')", 0.0),
        ("3*5+", 0.0),
        ("", 0.0),
    ],
)
def test_countdown_verifier_cases(completion, ok):
    assert CountdownVerifier().score(Problem("3 5 7>22:", "3*5+7"), completion) == ok


def test_jsonl_task(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(f'{{"prompt": "q{i}", "answer": {i}}}' for i in range(20)) + "\n")
    t = build_task("jsonl", path=str(f), eval_size=5)
    assert len(t.eval) == 4 and len(t.train) == 16  # eval capped at a fifth of the data
    assert t.train[0].answer.isdigit()


def test_jsonl_errors_name_file_and_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"prompt": "a", "answer": "1"}\n{not json}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        build_task("jsonl", path=str(f))
    f.write_text('{"prompt": "a"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: expected"):
        build_task("jsonl", path=str(f))
    with pytest.raises(FileNotFoundError):
        build_task("jsonl", path=str(tmp_path / "none.jsonl"))


def test_unknown_names_list_valid_ones():
    with pytest.raises(ValueError, match="valid: arithmetic, countdown, jsonl"):
        build_task("chess")


def test_math_verifier_works_off_the_main_thread():
    t = build_task("arithmetic", train_size=10, eval_size=2)
    v = build_verifier("math", t)
    results = {}

    def worker():
        results["ok"] = v.score(Problem("q", "$\\frac{1}{2}$"), "The answer is \\boxed{0.5}")
        results["bad"] = v.score(Problem("q", "$\\frac{1}{2}$"), "\\boxed{0.75}")

    th = threading.Thread(target=worker)
    th.start()
    th.join(60)
    v.close()
    assert results == {"ok": 1.0, "bad": 0.0}
