"""A fixed-seed embedded run's metrics are what they were when ``golden/`` was recorded
(``python tests/e2e/golden_runs.py record``): reorganising the learner loop, the weights
handshake or the sharing modes must not change a number. Wall-clock fields are left out; on a
CPU or torch build other than the recording's, floating-point results may differ in the last
bits, so the comparison runs only where the machine matches."""

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
    for got, want in zip(records, golden["records"]):
        # a diagnostic added to the records since the recording (on a machine like the recording's: AVX2) is not
        # compared; every recorded field must still be there with its recorded value
        got = {k: v for k, v in got.items() if k in want}
        assert got == want, {k: (got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k)}
    assert any(r.get("eval_accuracy") is not None and r["step"] > 0 for r in records)  # the run trained and evaluated
