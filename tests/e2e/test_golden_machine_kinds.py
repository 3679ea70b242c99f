"""Which golden recording a machine compares against: its own kind's (CPU capability, torch and AVX-512/AMX flags),
else one recorded before the flags were kept, else none (the fixed-seed test then skips)."""

import golden_runs


def _fake_machine(monkeypatch, capability: str, flags: str) -> None:
    monkeypatch.setattr(golden_runs.torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(golden_runs, "cpu_vector_flags", lambda: flags)


def test_a_machine_takes_its_own_kinds_recording_first_then_a_flagless_one(monkeypatch, tmp_path):
    torch_version = golden_runs.torch.__version__
    recs = {"run.json": {"cpu_capability": "AVX2", "torch": torch_version},
            "run.AVX512.json": {"cpu_capability": "AVX512", "torch": torch_version},
            "run.AVX512-x.json": {"cpu_capability": "AVX512", "torch": torch_version, "cpu_flags": "amx_tile avx512f"}}
    for name, m in recs.items():
        (tmp_path / name).write_text(golden_runs.json.dumps({"machine": m, "records": [name]}))
    monkeypatch.setattr(golden_runs, "GOLDEN", tmp_path)

    _fake_machine(monkeypatch, "AVX512", "amx_tile avx512f")
    assert golden_runs.golden_for("run")["records"] == ["run.AVX512-x.json"]
    _fake_machine(monkeypatch, "AVX512", "avx512f")  # another AVX-512 CPU: the recording made before flags were kept
    assert golden_runs.golden_for("run")["records"] == ["run.AVX512.json"]
    _fake_machine(monkeypatch, "AVX2", "")
    assert golden_runs.golden_for("run")["records"] == ["run.json"]
    _fake_machine(monkeypatch, "DEFAULT", "")
    assert golden_runs.golden_for("run") is None


def test_a_recordings_file_name_digests_its_flags():
    assert golden_runs.machine_kind({"cpu_capability": "AVX2", "cpu_flags": ""}) == "AVX2"
    kind = golden_runs.machine_kind({"cpu_capability": "AVX512", "cpu_flags": "amx_tile avx512f"})
    assert kind.startswith("AVX512-") and len(kind) == len("AVX512-") + 8
