"""`mutualrl compare`'s orchestration: resumes without rerunning finished runs, and reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mutualrl.app.compare import CompareSpec, run_all
from mutualrl.app.compare_report import write_report
from mutualrl.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path) -> Path:
    (tmp_path / "spec.yaml").write_text(f"""
name: t
baseline: grpo
seeds: [0, 1, 2]
steps: 2
pairs: {{demo: {ROOT / 'examples' / 'demo.yaml'}}}
entries: {{grpo: ["sharing.mode=none"], sgt: ["sharing.mode=sgt"]}}
""")
    return tmp_path / "spec.yaml"


def _fake_run(calls: list, fail_at: int | None = None):
    """Writes what `mutualrl run` writes: accuracy rises by 10 points for sgt, 5 for grpo."""
    def run(cfg, d: Path):
        if fail_at is not None and len(calls) == fail_at:
            raise KeyboardInterrupt
        calls.append((cfg.sharing.mode, cfg.seed))
        d.mkdir(parents=True, exist_ok=True)
        gain = 0.10 if cfg.sharing.mode == "sgt" else 0.05
        recs = []
        for p in cfg.policies:
            start = 0.2 + 0.01 * cfg.seed
            recs += [{"step": 0, "policy": p.name, "rollouts": 0, "eval_accuracy": start},
                     {"step": 2, "policy": p.name, "rollouts": 256, "eval_accuracy": start + gain}]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        start = 0.2 + 0.01 * cfg.seed
        policies = {p.name: {"warm_start_accuracy": start, "final_accuracy": start + gain, "rollouts": 256}
                    for p in cfg.policies}
        (d / "summary.json").write_text(json.dumps({"elapsed_s": 10.0, "policies": policies}))
    return run


def test_an_interrupted_compare_resumes_without_rerunning(tmp_path):
    spec = CompareSpec.load(_spec(tmp_path))
    calls: list = []
    with pytest.raises(KeyboardInterrupt):
        run_all(spec, tmp_path / "out", _fake_run(calls, fail_at=3))
    assert len(calls) == 3
    again: list = []
    run_all(spec, tmp_path / "out", _fake_run(again))
    assert len(again) == 6 - 3 and set(calls).isdisjoint(again)  # only the unfinished runs


def test_the_report_says_what_the_compare_cost_over_interrupted_invocations(tmp_path):
    """Run time is the sum of the runs' own wall times; the compare's wall time sums each
    invocation from its start to its last finished run, so an interrupt does not lose it."""
    spec = CompareSpec.load(_spec(tmp_path))
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_all(spec, out, _fake_run([], fail_at=2))
    run_all(spec, out, _fake_run([]))
    with (out / "sessions.jsonl").open("a") as f:
        f.write('{"session": 1.0, "t"')  # a line cut by a kill mid-write is skipped
    lines = [json.loads(x) for x in (out / "sessions.jsonl").read_text().splitlines()[:-1]]
    assert [x["event"] for x in lines] == ["start", "run", "run", "start", "run", "run", "run", "run"]
    first, second = lines[0]["session"], lines[3]["session"]
    expected = (lines[2]["t"] - first) + (lines[-1]["t"] - second)
    c = write_report(spec, out)["compute"]
    assert c["runs"] == c["of"] == 6 and c["run_seconds"] == 60.0 and c["invocations"] == 2 and c["jobs"] == [1]
    assert c["wall_seconds"] == pytest.approx(expected, abs=0.1)
    assert "Compute: 6 of 6 runs, 0.02 h of run time" in (out / "report.md").read_text()
    run_all(spec, out, _fake_run([]))  # nothing left to run: no invocation recorded
    assert write_report(spec, out)["compute"]["invocations"] == 2


def test_report_holds_final_accuracy_gain_and_rollouts_to_target(tmp_path):
    spec = CompareSpec.load(_spec(tmp_path))
    run_all(spec, tmp_path / "out", _fake_run([]))
    res = write_report(spec, tmp_path / "out")
    row = res["pairs"]["demo"]["sgt"]["llama-char"]
    assert row["gain"]["mean"] == pytest.approx(0.10) and row["gain"]["ci95"] == pytest.approx(0.0, abs=1e-12)
    assert row["final_accuracy"]["mean"] == pytest.approx(0.31)
    assert row["final_by_seed"] == pytest.approx({str(s): 0.30 + 0.01 * s for s in spec.seeds})
    # sgt reaches grpo's final (start + 5 points) halfway through: ratio 0.5 on every seed
    assert row["rollouts_to_target_ratio"]["mean"] == pytest.approx(0.5)
    assert row["paired_vs_baseline"]["mean"] == pytest.approx(0.05)
    assert res["pairs"]["demo"]["grpo"]["llama-char"]["rollouts_to_target_ratio"]["mean"] == pytest.approx(1.0)
    assert (tmp_path / "out" / "report.md").read_text().count("| sgt |") == 2
    assert (tmp_path / "out" / "curves-demo.png").is_file()


def test_the_named_policys_efficiency_is_against_the_baselines_mean_final(tmp_path):
    """grpo ends at 0.25, 0.26, 0.27 (mean 0.26): grpo's seed 0 never reaches it (512 counted, twice its budget),
    seed 1 at the end (256), seed 2 before it (0.26 - 0.22 of 0.05 over 256 rollouts: 204.8). sgt (+10 points over 256
    rollouts) reaches it at 153.6, 128 and 102.4."""
    path = _spec(tmp_path)
    path.write_text(path.read_text() + "efficiency_policy: llama-char\n")
    spec = CompareSpec.load(path)
    run_all(spec, tmp_path / "out", _fake_run([]))
    res = write_report(spec, tmp_path / "out")
    grpo = res["pairs"]["demo"]["grpo"]["llama-char"]["rollouts_to_baseline_mean"]
    sgt = res["pairs"]["demo"]["sgt"]["llama-char"]["rollouts_to_baseline_mean"]
    assert grpo["target"] == pytest.approx(0.26) and grpo["reached"] == 2 and grpo["runs"] == 3
    assert grpo["rollouts"]["mean"] == pytest.approx((512 + 256 + 204.8) / 3)
    assert sgt["reached"] == 3 and sgt["rollouts"]["mean"] == pytest.approx(128.0)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Efficiency, `llama-char` (named in the spec before the runs)" in report
    assert f"| {128 / ((512 + 256 + 204.8) / 3):.2f}× |" in report
    (tmp_path / "bad.yaml").write_text(path.read_text().replace("efficiency_policy", "efficiency_polcy"))
    from mutualrl.config import ConfigError

    with pytest.raises(ConfigError, match="unknown keys efficiency_polcy"):
        CompareSpec.load(tmp_path / "bad.yaml")


def test_a_bad_spec_is_one_clear_error(tmp_path):
    (tmp_path / "bad.yaml").write_text("baseline: x\nseeds: [0]\npairs: {}\nentries: {y: []}\n")
    from mutualrl.config import ConfigError

    with pytest.raises(ConfigError, match="baseline 'x' is not one of the entries"):
        CompareSpec.load(tmp_path / "bad.yaml")


def test_quick_narrows_seeds_steps_entries_and_pairs(tmp_path):
    (tmp_path / "spec.yaml").write_text(f"""
baseline: grpo
seeds: [0, 1, 2]
pairs: {{a: {ROOT / 'examples' / 'demo.yaml'}, b: {ROOT / 'examples' / 'demo.yaml'}}}
entries: {{grpo: [], sgt: ["sharing.mode=sgt"], prp: ["sharing.mode=prp"]}}
quick: {{seeds: [0], steps: 3, entries: [sgt], pairs: [b]}}
""")
    spec = CompareSpec.load(tmp_path / "spec.yaml", quick=True)
    assert spec.seeds == [0] and spec.steps == 3 and list(spec.pairs) == ["b"]
    assert set(spec.entries) == {"grpo", "sgt"}  # the baseline always stays
    (tmp_path / "bad.yaml").write_text((tmp_path / "spec.yaml").read_text().replace("pairs: [b]", "pairs: [zz]"))
    with pytest.raises(Exception, match="quick.pairs"):
        CompareSpec.load(tmp_path / "bad.yaml", quick=True)


def test_the_evidence_suite_is_valid():
    """Every entry of the committed evidence spec applies cleanly to every pair."""
    from mutualrl.config import load_config

    spec = CompareSpec.load(ROOT / "examples" / "evidence" / "compare.yaml")
    assert len(spec.seeds) >= 5 and len(spec.pairs) >= 2 and len(spec.entries) == 8
    for pair, path in spec.pairs.items():
        for entry, sets in spec.entries.items():
            cfg = load_config(path, sets)
            assert len({p.model.family for p in cfg.policies}) == 2, pair
            assert cfg.task.min_digits == 3 and cfg.base_seed is not None


@pytest.mark.parametrize("spec_file", sorted({*(ROOT / "examples").rglob("compare*.yaml"),
                                              *(ROOT / "examples").rglob("*-compare.yaml")}),
                         ids=lambda f: str(f.relative_to(ROOT / "examples")))
def test_every_committed_compare_spec_loads_and_applies(spec_file):
    """Every compare spec under examples/ (the evidence suite's follow-ups, the real pairs', the three families')
    loads, and each entry applies to each pair: a spec that runs for hours must not fail at its second entry."""
    from mutualrl.config import load_config

    spec = CompareSpec.load(spec_file)
    assert spec.baseline in spec.entries and spec.seeds
    for path in spec.pairs.values():
        for sets in spec.entries.values():
            load_config(path, sets)


def _fake_worker_run(cfg, d: Path) -> None:
    """A module-level runner (worker processes pickle it): what `mutualrl run` writes, gain 5 points."""
    d.mkdir(parents=True, exist_ok=True)
    recs = [{"step": s, "policy": p.name, "rollouts": 128 * s,
             "eval_accuracy": 0.2 + 0.025 * s} for p in cfg.policies for s in (0, 2)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "summary.json").write_text(json.dumps({"policies": {p.name: {"warm_start_accuracy": 0.2,
        "final_accuracy": 0.25, "rollouts": 256}
                                                             for p in cfg.policies}}))


def test_parallel_jobs_train_every_unfinished_run_once(tmp_path):
    spec = CompareSpec.load(_spec(tmp_path))
    first = run_dir_of(spec, tmp_path / "out")[0]
    _fake_worker_run(load_first(spec), first)  # one run finished before: skipped
    seen: list = []
    done = run_all(spec, tmp_path / "out", _fake_worker_run, lambda i, n, s: seen.append((i, s)), jobs=2)
    assert sorted(map(str, done)) == sorted(map(str, run_dir_of(spec, tmp_path / "out")))
    assert seen[-1][0] == 6 and sum("done before" in s for _, s in seen) == 1
    assert write_report(spec,
                        tmp_path / "out")["pairs"]["demo"]["sgt"]["llama-char"]["gain"]["mean"] == pytest.approx(0.05)


def run_dir_of(spec, out: Path) -> list[Path]:
    from mutualrl.app.compare import run_dir

    return [run_dir(out, e, p, s) for e, p, s in spec.runs()]


def load_first(spec):
    from mutualrl.config import load_config

    e, p, s = spec.runs()[0]
    return load_config(spec.pairs[p], [*spec.entries[e], f"seed={s}"])


def test_a_run_whose_event_was_never_logged_still_counts_in_the_wall_time(tmp_path):
    """An invocation killed before it logged its finished runs: each finished run's summary time is
    given to the latest invocation that started before it."""
    import os

    from mutualrl.app.compare_analysis import compute

    spec = CompareSpec.load(_spec(tmp_path))
    out = tmp_path / "out"
    run_all(spec, out, _fake_run([]))
    (out / "sessions.jsonl").write_text('{"session": 1000.0, "t": 1000.0, "event": "start", "jobs": 2}\n'
                                        '{"session": 5000.0, "t": 5000.0, "event": "start", "jobs": 2}\n')
    for i, (e, p, s) in enumerate(spec.runs()):
        os.utime(out / "runs" / e / p / f"seed{s}" / "summary.json",
                 (0, 1100.0 + 100 * i if i < 3 else 5050.0 + 10 * i))
    c = compute(spec, out)
    assert c["invocations"] == 2 and c["wall_seconds"] == pytest.approx((1300 - 1000) + (5100 - 5000))


def test_logged_runs_copied_later_add_nothing_to_the_wall_time(tmp_path):
    """Committed records are copies: their summary.json times are the copy's, days after the runs. A run the
    log names counts by its logged time only, so the copy does not stretch the last invocation."""
    import os

    from mutualrl.app.compare_analysis import compute

    spec = CompareSpec.load(_spec(tmp_path))
    out = tmp_path / "out"
    run_all(spec, out, _fake_run([]))
    labels = [f"{e} / {p} / seed {s}" for e, p, s in spec.runs()]
    lines = ['{"session": 1000.0, "t": 1000.0, "event": "start", "jobs": 1}']
    lines += [f'{{"session": 1000.0, "t": {1100.0 + 100 * i}, "event": "run", "run": "{label}"}}'
              for i, label in enumerate(labels)]
    (out / "sessions.jsonl").write_text("\n".join(lines) + "\n")
    for e, p, s in spec.runs():
        os.utime(out / "runs" / e / p / f"seed{s}" / "summary.json", (0, 1000.0 + 86400 * 3))  # copied 3 days on
    c = compute(spec, out)
    assert c["invocations"] == 1 and c["wall_seconds"] == pytest.approx(100.0 * len(labels))


def test_the_summary_table_puts_policies_in_columns_with_paired_differences(tmp_path):
    from mutualrl.app.compare_report import summary_table

    spec = CompareSpec.load(_spec(tmp_path))
    run_all(spec, tmp_path / "out", _fake_run([]))
    table = summary_table(write_report(spec, tmp_path / "out"), "demo").splitlines()
    assert table[0] == "| entry | llama-char | qwen-bpe |"
    # grpo: 21 + 5 points over seeds 0..2 -> 26.0 ± 2.5 (t(2) = 4.303 · sd 0.01 / sqrt(3)); sgt 5 points above on every
    # seed
    assert table[2] == "| grpo | 26.0 ± 2.5, n=3 | 26.0 ± 2.5, n=3 |"
    assert table[3] == "| sgt | 31.0 ± 2.5 (+5.0 ± 0.0), n=3 | 31.0 ± 2.5 (+5.0 ± 0.0), n=3 |"


def test_the_report_names_each_pairs_steps_when_the_spec_sets_none(tmp_path):
    """Without `steps:` in the spec every pair runs its own budget.steps: the report says how many
    each pair's runs recorded rather than printing 'None steps'."""
    from mutualrl.app.compare_report import report_md

    (tmp_path / "spec.yaml").write_text(_spec(tmp_path).read_text().replace("steps: 2\n", ""))
    spec = CompareSpec.load(tmp_path / "spec.yaml")
    fake = _fake_run([])

    def run(cfg, d: Path):
        fake(cfg, d)
        summary = json.loads((d / "summary.json").read_text())
        (d / "summary.json").write_text(json.dumps({**summary, "steps": cfg.budget.steps}))

    run_all(spec, tmp_path / "out", run)
    res = write_report(spec, tmp_path / "out")
    steps = res["steps_by_pair"]["demo"]
    assert res["steps"] is None and len(steps) == 1 and steps[0] > 0
    assert f"RL steps per pair: demo {steps[0]};" in (tmp_path / "out" / "report.md").read_text()
    assert "None steps" not in report_md({**res, "steps_by_pair": {}})


def test_a_subset_of_entries_and_seeds_trains_alone_and_the_report_covers_every_finished_run(tmp_path):
    spec = CompareSpec.load(_spec(tmp_path))
    calls: list = []
    run_all(spec.subset(["grpo"], [0, 1]), tmp_path / "out", _fake_run(calls), lambda *a: None)
    assert sorted(calls) == [("none", 0), ("none", 1)]
    run_all(spec.subset(["sgt"], [0]), tmp_path / "out", _fake_run(calls), lambda *a: None)
    assert calls[-1] == ("sgt", 0)
    results = write_report(spec, tmp_path / "out")
    assert results["pairs"]["demo"]["sgt"]["llama-char"]["seeds"] == [0]
    assert results["pairs"]["demo"]["grpo"]["llama-char"]["seeds"] == [0, 1]
    with pytest.raises(Exception, match="no entry nope"):
        spec.subset(["nope"])


def test_a_subset_runs_its_entries_in_the_order_named_seed_by_seed(tmp_path):
    spec = CompareSpec.load(_spec(tmp_path))
    assert list(spec.entries)[:2] == ["grpo", "sgt"]  # the file's order
    chosen = spec.subset(["sgt", "grpo", "sgt"], [1, 0])
    assert [(e, s) for e, _, s in chosen.runs()] == [("sgt", 1), ("grpo", 1), ("sgt", 0), ("grpo", 0)]
    assert list(spec.subset(None).entries) == list(spec.entries)
    assert [(e, s) for e, _, s in spec.subset(["grpo"], [2, 2]).runs()] == [("grpo", 2)]  # not trained twice


def test_the_report_shows_each_edges_example_hints_verified_first(tmp_path):
    """SGT-R's step records keep a few (hint, rescue sample) pairs; the report shows up to five per edge of the first
    seed that has any, verified samples first, each text one table cell (newlines and pipes cannot break the row)."""
    base = _fake_run([])

    def run(cfg, d: Path):
        base(cfg, d)
        if cfg.sharing.mode != "sgt":
            return
        receiver, peer = cfg.policies[0].name, cfg.policies[1].name
        recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        for step in range(1, 5):
            recs.append({"step": step, "policy": receiver, "hint_examples": [
                {"source": peer, "prompt": "2+2?", "hint": f"2 + 2 = 4 | step {step}\nso <answer>…</answer>",
                 "delta": 0.5 * step, "sample": f"it is {step}", "reward": float(step == 3), "cut_off": step == 3},
                {"source": peer, "prompt": "3+3?", "hint": None, "delta": None, "sample": "6", "reward": 0.0}]})
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))

    spec = CompareSpec.load(_spec(tmp_path))
    run_all(spec, tmp_path / "out", run)
    res = write_report(spec, tmp_path / "out")
    receiver = next(iter(res["pairs"]["demo"]["sgt"]))
    exs = res["pairs"]["demo"]["sgt"][receiver]["hint_examples"]
    assert len(exs) == 5 and exs[0]["step"] == 3 and exs[0]["reward"] == 1.0  # the verified one first
    assert [e["step"] for e in exs[1:]] == [1, 1, 2, 2]
    assert all(not r.get("hint_examples") for r in res["pairs"]["demo"]["grpo"].values())
    md = (tmp_path / "out" / "report.md").read_text()
    section = md.split("### Example hints and rescue samples")[1]
    rows = [x for x in section.splitlines() if x.startswith("| 3 |")]
    assert rows == ["| 3 | " + exs[0]["source"] + " | 2 + 2 = 4 \\| step 3 ⏎ so <answer>…</answer> | +1.50 | it is 3 "
                    "| yes (cut off) |"]  # the token limit cut it off: verified, not trained (§3.5)
    assert "| 1 | " + exs[0]["source"] + " | – | – | 6 | no |" in section  # a plain resample


def test_the_report_sums_each_sharing_edge_over_a_run_and_averages_over_seeds(tmp_path):
    """A sharing graph's step records count per edge (``edges``); the report gives each edge's sums per run, mean over
    an entry's seeds, so a graph run shows which edges carried hints and rescues and which carried nothing."""
    base = _fake_run([])

    def run(cfg, d: Path):
        base(cfg, d)
        a, b = cfg.policies[0].name, cfg.policies[1].name
        recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        for step in (1, 2):
            recs.append({"step": step, "policy": a, "edges": {f"{b}->{a}": {
                "offered": 2, "used": 1, "stale": 0, "thl_rejected": cfg.seed, "rescues": 0,
                "hints_offered": 3, "rescue_samples": 4 * (cfg.seed + 1), "rescued": 1, "rescue_trained": 1}}})
            recs.append({"step": step, "policy": b, "edges": {f"{a}->{b}": {"offered": 1, "used": 0, "stale": 1,
                                                                            "thl_rejected": 0, "rescues": 0}}})
        recs.append({"step": 0, "policy": a, "phase": "warm_start", "edges": {f"{b}->{a}": {"offered": 99}}})
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))

    spec = CompareSpec.load(_spec(tmp_path))
    run_all(spec, tmp_path / "out", run)
    res = write_report(spec, tmp_path / "out")
    a, b = next(iter(res["pairs"]["demo"]["sgt"])), list(res["pairs"]["demo"]["sgt"])[-1]
    edges = res["edges_by_pair"]["demo"]["sgt"]
    ab = edges[f"{b}->{a}"]
    # over seeds 0, 1, 2: two steps each, the warm start not counted
    assert ab["offered"] == 4 and ab["hints_offered"] == 6 and ab["rescue_trained"] == 2
    assert ab["thl_rejected"] == pytest.approx(2 * (0 + 1 + 2) / 3)
    assert ab["rescue_samples"] == pytest.approx(2 * 4 * (1 + 2 + 3) / 3)
    assert edges[f"{a}->{b}"]["stale"] == 2 and "rescue_samples" not in edges[f"{a}->{b}"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert f"| sgt | {b}->{a} | 4 | 2 | 0 | 2 | 0 | 6 | – | – | 16 | 2 | 2 |" in md
    assert f"| sgt | {a}->{b} | 2 | 0 | 2 | 0 | 0 | – | – | – | – | – | – |" in md


def test_the_report_names_a_policy_no_edge_reaches_as_learning_alone(tmp_path):
    """Pair B's SmolLM2 only sends: in every sharing entry it learns alone, and its paired difference against the
    baseline (−1 to −3.5 points there) is the runs' own variation. The report says so in its row, and only where the
    entry's named edges leave the policy without one into it."""
    base = _fake_run([])

    def run(cfg, d: Path):
        base(cfg, d)
        a, b = cfg.policies[0].name, cfg.policies[1].name
        recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        if cfg.sharing.mode == "sgt":  # one edge, b -> a, recorded on the receiver's step
            recs.append({"step": 1, "policy": a, "edges": {f"{b}->{a}": {"offered": 2, "used": 1}}})
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (d / "evals").mkdir()
        for p in (a, b):
            (d / "evals" / f"{p}.jsonl").write_text("".join(json.dumps(
                {"step": s, "accuracy": 0.5, "prompt_ids": ["x", "y"], "correct": "10", "texts": ["1 + 2 = 3", "4"]})
                + "\n" for s in (0, 2)))

    spec = CompareSpec.load(_spec(tmp_path))
    run_all(spec, tmp_path / "out", run)
    res = write_report(spec, tmp_path / "out")
    a, b = next(iter(res["pairs"]["demo"]["sgt"])), list(res["pairs"]["demo"]["sgt"])[-1]
    rows = {tuple(x.split(" | ")[:2]): x for x in (tmp_path / "out" / "report.md").read_text().splitlines()
            if x.startswith(("| sgt | ", "| grpo | ")) and "% work" in x}
    alone = "receives nothing (no edge into it): its paired difference is the runs' own variation |"
    assert rows[("| sgt", b)].endswith(alone)
    assert not rows[("| sgt", a)].endswith(alone)  # the receiver
    assert not any(rows[("| grpo", p)].endswith(alone) for p in (a, b))  # the baseline names no edges


def test_the_report_warns_when_the_runs_of_a_pair_trained_in_different_precisions(tmp_path):
    """`model.dtype: auto` resolves by the CPU (bf16-mixed where it has bf16 instructions), so a compare resumed on
    another machine can mix precisions; the report says which runs trained in which, from the summary or, for runs
    written before the summary kept it, from the progress log's loading line."""
    base = _fake_run([])

    def run(cfg, d: Path):
        base(cfg, d)
        s = json.loads((d / "summary.json").read_text())
        if cfg.sharing.mode == "sgt":
            for v in s["policies"].values():
                v["precision"] = "bf16-mixed"
        else:  # an older run: only its progress log says
            (d / "progress.log").write_text("".join(f"[    1.0s] [{p.name}] loading model (float32: auto: CPU without "
                                                    "AVX-512 BF16)\n" for p in cfg.policies))
        (d / "summary.json").write_text(json.dumps(s))

    spec = CompareSpec.load(_spec(tmp_path))
    run_all(spec, tmp_path / "out", run)
    res = write_report(spec, tmp_path / "out")
    mixed = res["mixed_precision_by_pair"]["demo"]
    assert set(mixed) == {"llama-char", "qwen-bpe"}
    assert mixed["llama-char"] == {"float32": ["grpo seed 0", "grpo seed 1", "grpo seed 2"],
                                   "bf16-mixed": ["sgt seed 0", "sgt seed 1", "sgt seed 2"]}
    assert "did not all train in the same precision" in (tmp_path / "out" / "report.md").read_text()


def test_runs_of_one_precision_get_no_warning(tmp_path):
    spec = CompareSpec.load(_spec(tmp_path))
    run_all(spec, tmp_path / "out", _fake_run([]))
    res = write_report(spec, tmp_path / "out")
    assert res["mixed_precision_by_pair"]["demo"] == {}
    assert "same precision" not in (tmp_path / "out" / "report.md").read_text()


def test_precisions_the_entries_chose_are_not_warned_about(tmp_path):
    """A precision compare sets model.dtype per entry: fp32 beside bf16-mixed is what it measures, not a confound.
    The same mix is warned about as soon as one run left its precision to `auto`."""
    base = _fake_run([])

    def run(cfg, d: Path, chosen=True):
        base(cfg, d)
        s = json.loads((d / "summary.json").read_text())
        prec = "bf16-mixed" if cfg.sharing.mode == "sgt" else "float32"
        for v in s["policies"].values():
            v["precision"] = prec
        (d / "summary.json").write_text(json.dumps(s))
        dtype = prec if chosen or cfg.sharing.mode == "sgt" else "auto"
        (d / "config.yaml").write_text(yaml.safe_dump({"policies": [{"name": p.name, "model": {"dtype": dtype}}
                                                                    for p in cfg.policies]}))

    spec = CompareSpec.load(_spec(tmp_path))
    run_all(spec, tmp_path / "chosen", run)
    assert write_report(spec, tmp_path / "chosen")["mixed_precision_by_pair"]["demo"] == {}
    assert "same precision" not in (tmp_path / "chosen" / "report.md").read_text()
    run_all(spec, tmp_path / "auto", lambda cfg, d: run(cfg, d, chosen=False))
    mixed = write_report(spec, tmp_path / "auto")["mixed_precision_by_pair"]["demo"]
    assert set(mixed) == {"llama-char", "qwen-bpe"}


def test_the_report_gives_a_receivers_rescue_counts_and_its_rescued_tokens_mean_weight(tmp_path):
    """SGT-R's per-step means (a rescued token's weight, the shares at its floor and cap, the gate's Δ) are averaged
    over the steps that recorded one, then over the runs that have any: a run whose rescues never trained counts in
    the sums, not in the weight. Fewer than one trained rescue a step is called "not exercised"."""
    base = _fake_run([])
    weights = {0: [0.8, 0.6], 1: [1.0], 2: []}

    def run(cfg, d: Path):
        base(cfg, d)
        if cfg.sharing.mode != "sgt":
            return
        receiver = cfg.policies[0].name
        recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        recs = [r for r in recs if not (r["policy"] == receiver and r["step"] == 2)]  # the step-2 record, rebuilt
        ws = weights[cfg.seed]
        for step in (1, 2, 3, 4):
            w = ws[step - 1] if step <= len(ws) else None
            recs.append({"step": step, "policy": receiver, "hints_offered": 2, "hints_masked": 2, "rescue_samples": 8,
                         "rescued": 1, "rescue_trained": 1 + cfg.seed, "rescue_cut_off": int(step == 1),
                         "hint_weight_mean": w,
                         "hint_floored_frac": None if w is None else 0.1,
                         "hint_capped_frac": None if w is None else 0.0,
                         "hint_delta_mean": 2.0 if step == 1 else None, "own_sampled_nll": 1.0 - 0.2 * step,
                         **({"rollouts": 256, "eval_accuracy": 0.3} if step == 2 else {})})
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (d / "evals").mkdir()
        worked = "1 + 2 equals 3." if cfg.seed == 2 else "1 + 2 = 3"  # seed 2's receiver takes up other wording
        (d / "evals" / f"{receiver}.jsonl").write_text("".join(json.dumps(
            {"step": s, "accuracy": 0.5, "prompt_ids": ["a", "b"], "correct": "10",
             "texts": [worked if s else "1 + 2 = 3", "4"]}) + "\n" for s in (0, 4)))

    spec = CompareSpec.load(_spec(tmp_path))
    run_all(spec, tmp_path / "out", run)
    res = write_report(spec, tmp_path / "out")
    receiver = next(iter(res["pairs"]["demo"]["sgt"]))
    c = res["pairs"]["demo"]["sgt"][receiver]["sharing"]
    assert c["rescue_samples"] == 32 and c["rescue_trained"] == pytest.approx(4 * (1 + 2 + 3) / 3)
    assert c["trained_per_step"] == pytest.approx((1 + 2 + 3) / 3)
    assert c["hint_weight_mean"] == pytest.approx((0.7 + 1.0) / 2)  # seed 2 trained no weighted token: not a 0
    assert c["hint_floored_frac"] == pytest.approx(0.1) and c["hint_delta_mean"] == pytest.approx(2.0)
    md = (tmp_path / "out" / "report.md").read_text()
    assert ("hints 8 (gated out 0, masked 8, refused 0); samples 32, rescued 4, trained 8 (2.0 a step), 1 verified "
            "but cut off (not trained); rescue "
            "samples' token weight 0.85 (at the floor 10 %, at the cap 0 %); gate Δ +2.0 nats |") in md
    style = res["pairs"]["demo"]["sgt"][receiver]["style"]  # the sampling entropy of step 1 and of the last step
    assert style["start"]["sampled_entropy"] == pytest.approx(0.8)
    assert style["final"]["sampled_entropy"] == pytest.approx(0.2)
    assert "sampled entropy 0.80 nats/token" in md and "sampled entropy 0.20 nats/token" in md
    # answer shapes: each run's shares, averaged over the runs (a shape a run lacks is 0 in it), largest first
    assert style["start"]["shapes"] == {"# + # = #": pytest.approx(0.5), "#": pytest.approx(0.5)}
    assert style["final"]["shapes"] == {"#": pytest.approx(0.5), "# + # = #": pytest.approx(1 / 3),
                                        "# + # equals #.": pytest.approx(1 / 6)}
    assert "; `#` 50 %, `# + # = #` 33 %, `# + # equals #.` 17 % |" in md


def _sgt_runs_with_step_records(per_policy: list[list[dict]]):
    """The fake run, whose `sgt` entry records for each policy (in the spec's order) one record a step with the given
    counts, step 2 also carrying the evaluation the report reads; the other entries' runs are left as they are."""
    base = _fake_run([])

    def run(cfg, d: Path):
        base(cfg, d)
        if cfg.sharing.mode != "sgt":
            return
        recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        recs = [r for r in recs if r["step"] != 2]  # the step-2 records, rebuilt below
        for p, steps in zip(cfg.policies, per_policy):
            for step, counts in enumerate(steps, start=1):
                recs.append({"step": step, "policy": p.name, **counts,
                             **({"rollouts": 256, "eval_accuracy": 0.3} if step == 2 else {})})
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return run


def test_the_report_counts_hacpos_cross_rows_below_the_ratios_bound_and_calls_too_few_above_it_not_exercised(tmp_path):
    """HACPO's hard clamp leaves a cross row below the ratio's lower bound no gradient (§2.7): the report sums each
    step's ``cross_rows × cross_discarded_frac`` and calls a receiver with < 1 cross row a step not below the bound "not
    exercised", as it does SGT-R's with < 1 trained rescue a step."""
    below_by_policy = [[1.0, 1.0, 0.9375, 1.0], [0.5, 0.5, 0.5, 0.5]]  # policy 0: 2 of 128 not below; policy 1: half
    run = _sgt_runs_with_step_records([[{"cross_rows": rows, "cross_discarded_frac": f} for f in fracs]
                                       for fracs, rows in zip(below_by_policy, (32, 16))])
    spec = CompareSpec.load(_spec(tmp_path))
    run_all(spec, tmp_path / "out", run)
    res = write_report(spec, tmp_path / "out")
    first, second = (p.name for p in load_config(ROOT / "examples" / "demo.yaml").policies)
    c = res["pairs"]["demo"]["sgt"][first]["sharing"]
    assert c["cross_rows"] == 128 and c["cross_below_bound"] == 126 and c["cross_not_below_per_step"] == 0.5
    assert res["pairs"]["demo"]["sgt"][second]["sharing"]["cross_not_below_per_step"] == 8
    md = (tmp_path / "out" / "report.md").read_text()
    assert ("HACPO cross rows 128, 126 below the ratio's lower bound (98 %, no gradient): at most 0.5 a step trained "
            "— **not exercised** (< 1 cross row a step not below the bound) |") in md
    assert ("HACPO cross rows 64, 32 below the ratio's lower bound (50 %, no gradient): at most 8.0 a step "
            "trained |") in md


def test_the_report_gives_sgts_trained_successes_a_step_and_calls_fewer_than_one_not_exercised(tmp_path):
    """SGT trains its NLL on a peer's verified successes (``rescue_count`` a step): the issue's rule for a receiver
    with < 1 trained rescue a step ("not exercised", never "no harm") holds for SGT's rows as it does for SGT-R's."""
    rescues_by_policy = [[1, 2, 1, 0], [0, 1, 0, 0]]  # policy 0: 1.0 a step (exercised); policy 1: 0.25
    run = _sgt_runs_with_step_records([[{"rescue_count": n} for n in counts] for counts in rescues_by_policy])
    spec = CompareSpec.load(_spec(tmp_path))
    run_all(spec, tmp_path / "out", run)
    res = write_report(spec, tmp_path / "out")
    first, second = (p.name for p in load_config(ROOT / "examples" / "demo.yaml").policies)
    assert res["pairs"]["demo"]["sgt"][first]["sharing"]["rescues_per_step"] == 1.0
    assert res["pairs"]["demo"]["sgt"][second]["sharing"]["rescues_per_step"] == 0.25
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| SGT rescues 4 (1.0 a step) |" in md
    assert "| SGT rescues 1 (0.2 a step) — **not exercised** (< 1 trained success a step) |" in md


def test_the_plotted_accuracy_band_stays_inside_zero_and_one():
    """Two seeds' t-interval is wider than the scale (pair A's SmolLM2 curves had ±1.3 around 0.5): the plot clips
    the band to accuracy's range and leaves a narrow one as it is."""
    from mutualrl.app.compare_report import accuracy_band

    lower, upper = accuracy_band([0.5, 0.9, 0.1], [1.3, 0.05, 0.0])
    assert lower == [0.0, pytest.approx(0.85), 0.1]
    assert upper == [1.0, pytest.approx(0.95), 0.1]


def test_answer_shapes_in_the_report_name_the_common_ones_and_keep_the_table_whole():
    """The most common shape always, the rest from 5 % of the answers; a pipe in a shape would split the markdown
    table's cell and a backtick would end its code span."""
    from mutualrl.app.compare_report import _shapes_text

    assert _shapes_text({"# | #": 0.9, "`#`": 0.06, "#.": 0.04}) == "`# \\| #` 90 %, `'#'` 6 %"
    assert _shapes_text({"#": 0.02}) == "`#` 2 %"
    assert _shapes_text({}) == "" and _shapes_text(None) == ""
    assert _shapes_text({"#": 0.92, "": 0.08}) == "`#` 92 %, (empty) 8 %"


def test_the_report_gives_each_seeds_per_problem_difference_beside_the_pooled_one(tmp_path):
    """Four held-out problems: sgt answers all of them at seeds 0 and 2 and only the first at seed 1; grpo answers the
    first two at every seed. Pooled over the seeds sgt is ahead; seed 1 alone it is behind, and the report says so."""
    base = _fake_run([])

    def run(cfg, d: Path):
        base(cfg, d)
        correct = "1100" if cfg.sharing.mode != "sgt" else ("1000" if cfg.seed == 1 else "1111")
        (d / "evals").mkdir()
        for p in cfg.policies:
            (d / "evals" / f"{p.name}.jsonl").write_text(json.dumps(
                {"step": 2, "accuracy": correct.count("1") / 4, "prompt_ids": ["a", "b", "c", "d"],
                 "correct": correct, "texts": ["1"] * 4}) + "\n")

    spec = CompareSpec.load(_spec(tmp_path))
    run_all(spec, tmp_path / "out", run)
    res = write_report(spec, tmp_path / "out")
    row = next(iter(res["pairs"]["demo"]["sgt"].values()))
    # per problem over 3 seeds: a 0, b (0 - 1 + 0)/3, c and d (1 + 0 + 1)/3; seed 1 alone: [0, -1, 0, 0], sd 0.5, so
    # ± t(0.975, 3 df) · 0.5 / 2 = 3.182 · 0.25 = 0.795
    assert row["per_problem_vs_baseline"]["mean"] == pytest.approx((-1 / 3 + 2 / 3 + 2 / 3) / 4)
    assert {s: x["mean"] for s, x in row["per_problem_by_seed"].items()} == {0: 0.5, 1: -0.25, 2: 0.5}
    assert next(iter(res["pairs"]["demo"]["grpo"].values()))["per_problem_by_seed"] is None  # the baseline
    md = (tmp_path / "out" / "report.md").read_text()
    assert "(4 problems × 3 seeds); by seed: 0 +50.0 ± 91.9, 1 -25.0 ± 79.5, 2 +50.0 ± 91.9 |" in md
    # read back from results.json (string keys), the seeds still sort as numbers
    from mutualrl.app.compare_report import report_md
    again = report_md(json.loads((tmp_path / "out" / "results.json").read_text()))
    assert "by seed: 0 +50.0 ± 91.9, 1 -25.0 ± 79.5, 2 +50.0 ± 91.9" in again


def _pid_recording_run(cfg, d: Path) -> None:
    """A module-level runner that notes which process trained the run."""
    import os

    _fake_worker_run(cfg, d)
    (d / "pid").write_text(str(os.getpid()))


def _killed_at_seed_one(cfg, d: Path) -> None:
    """A runner whose process is killed from outside (as the kernel kills for memory) on seed 1's runs."""
    import os
    import signal

    if cfg.seed == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    _fake_worker_run(cfg, d)


def test_an_isolated_sequential_compare_trains_each_run_in_a_fresh_process(tmp_path):
    """One job, isolated (as the CLI runs it): every run in a process of its own, none in the caller's, so a
    finished run's memory cannot carry into the next."""
    import os

    spec = CompareSpec.load(_spec(tmp_path)).subset(seeds=[0, 1])
    done = run_all(spec, tmp_path / "out", _pid_recording_run, jobs=1, isolate=True)
    pids = [int((d / "pid").read_text()) for d in done]
    assert len(done) == len(spec.runs()) == 4
    assert os.getpid() not in pids and len(set(pids)) == len(pids)


def test_a_run_whose_process_is_killed_names_the_run_and_keeps_the_finished_ones(tmp_path):
    from mutualrl.app.compare import RunProcessDied

    spec = CompareSpec.load(_spec(tmp_path)).subset(["grpo"], [0, 1])
    with pytest.raises(RunProcessDied, match=r"seed 1 died without finishing it .*trains it again"):
        run_all(spec, tmp_path / "out", _killed_at_seed_one, jobs=1, isolate=True)
    finished = [d for d in run_dir_of(spec, tmp_path / "out") if (d / "summary.json").is_file()]
    assert [d.name for d in finished] == ["seed0"]


def _host(cpu: str) -> dict:
    return {"cpu": cpu, "cpu_model": "6/143", "flags": ["avx512_bf16"], "torch": "2.13.0", "threads": 2}


def test_the_report_warns_when_one_seeds_runs_came_from_different_machines(tmp_path):
    """bf16 rounds differently across CPUs, so a seed's paired runs from two machines can differ by a mode's whole
    effect; the report names the seed and which entry ran where. Runs from before summaries named their machine
    (no ``host``) are not guessed at."""
    base = _fake_run([])

    def run(cfg, d: Path):
        base(cfg, d)
        s = json.loads((d / "summary.json").read_text())
        if cfg.seed == 1:
            s["host"] = _host("Xeon A" if cfg.sharing.mode == "sgt" else "EPYC B")
        elif cfg.seed == 2:
            s["host"] = _host("Xeon A")
        (d / "summary.json").write_text(json.dumps(s))

    spec = CompareSpec.load(_spec(tmp_path))
    run_all(spec, tmp_path / "out", run)
    res = write_report(spec, tmp_path / "out")
    mixed = res["mixed_hosts_by_pair"]["demo"]
    assert list(mixed) == [1]
    assert mixed[1] == {"EPYC B (6/143), avx512_bf16, torch 2.13.0": ["grpo"],
                        "Xeon A (6/143), avx512_bf16, torch 2.13.0": ["sgt"]}
    report = (tmp_path / "out" / "report.md").read_text()
    assert "a seed's runs came from different machines" in report
    assert "seed 1: grpo on EPYC B" in report and "seed 0" not in report.split("different machines")[1].split("\n")[0]


def test_runs_from_one_machine_get_no_machine_warning(tmp_path):
    base = _fake_run([])

    def run(cfg, d: Path):
        base(cfg, d)
        s = json.loads((d / "summary.json").read_text())
        s["host"] = _host("Xeon A")
        (d / "summary.json").write_text(json.dumps(s))

    spec = CompareSpec.load(_spec(tmp_path))
    run_all(spec, tmp_path / "out", run)
    assert write_report(spec, tmp_path / "out")["mixed_hosts_by_pair"]["demo"] == {}
    assert "different machines" not in (tmp_path / "out" / "report.md").read_text()
