"""A fixed-seed embedded run's metrics are what they were when ``golden/`` was recorded
(``python tests/e2e/golden_runs.py record``): reorganising the learner loop, the weights
handshake or the sharing modes must not change a number. Wall-clock fields are left out; on a
CPU or torch build other than the recording's, floating-point results may differ in the last
bits, so the comparison runs only where the machine matches: its CPU flags exactly, or, through a recording made
before recordings named them, its step-0 evaluation."""

import pytest
from golden_runs import RUNS, golden_for, machine, recordings, run

# async.max_staleness 0 with lockstep peers, said explicitly, is the synchronous run the golden files recorded
EXPLICIT_SYNC = ("async.max_staleness=0", "async.peers=lockstep")


@pytest.mark.parametrize("name, extra", [(n, ()) for n in sorted(RUNS)] + [("embedded-sgt", EXPLICIT_SYNC)],
                         ids=[*sorted(RUNS), "embedded-sgt-async-0-lockstep"])
def test_fixed_seed_run_reproduces_its_recorded_metrics(name, extra, tmp_path):
    golden = golden_for(name)
    if golden is None:
        kinds = [g["machine"] for g in recordings(name)]
        pytest.skip(f"recorded on {kinds}, this machine is {machine()} (`python tests/e2e/golden_runs.py record`)")
    records = run(name, tmp_path / name, extra)
    assert len(records) == len(golden["records"])
    # a diagnostic added to the records since the recording (on a machine like the recording's: AVX2) is not
    # compared; every recorded field must still be there with its recorded value
    pairs = [({k: v for k, v in got.items() if k in want}, want) for got, want in zip(records, golden["records"])]
    start = [(got, want) for got, want in pairs if want.get("step") == 0]
    if golden["machine"] != machine() and any(got != want for got, want in start):
        # a recording made before recordings named the CPU's flags stands in for this machine; its step-0 evaluation
        # (the warm start alone, before any RL code runs) tells whether it was made on a CPU like this one. Two Intel
        # AVX-512 CPUs (one with AMX, one without AVX-512 BF16) start at 0.03 where it starts at 0.34
        pytest.skip(f"{name}: the recording this machine falls back to ({golden['machine']}) starts elsewhere at "
                    f"step 0 ({start[0][1]} recorded, {start[0][0]} here): another CPU kind "
                    f"({machine()}; `python tests/e2e/golden_runs.py record` adds it)")
    for got, want in pairs:
        assert got == want, {k: (got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k)}
    assert any(r.get("eval_accuracy") is not None and r["step"] > 0 for r in records)  # the run trained and evaluated
