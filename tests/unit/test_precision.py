"""What ``model.dtype`` resolves to on a device, and the warning for a bf16 precision a CPU only emulates
(docs/algorithms.md §7.1)."""

import pytest
import torch

from mutualrl.app.compare_progress import PROGRESS_FILE, FileReporter
from mutualrl.models.precision import cpu_bf16_flags, resolve_precision

AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2\n"
AVX512_BF16 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
AMX = "processor\t: 0\nflags\t\t: fpu avx2 amx_bf16 amx_tile\n"
AVX512_NO_BF16 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw avx512_vnni\n"


def test_the_flags_that_make_bf16_fast_are_read_from_the_first_flags_line():
    assert cpu_bf16_flags(AVX2) == []
    assert cpu_bf16_flags(AVX512_BF16) == ["avx512_bf16"]
    assert cpu_bf16_flags(AMX) == ["amx_bf16"]
    assert cpu_bf16_flags("") == []


@pytest.mark.parametrize("cpuinfo, want", [(AVX2, "float32"), (AVX512_BF16, "bf16-mixed"), (AMX, "bf16-mixed")])
def test_auto_picks_bf16_mixed_for_a_loaded_model_only_where_the_cpu_has_fast_bf16(cpuinfo, want):
    p = resolve_precision("auto", pretrained=True, device="cpu", cpuinfo=cpuinfo)
    assert p.name == want and p.why.startswith("auto: ")
    assert p.warning == ""  # auto never picks a precision that crawls
    assert resolve_precision("auto", pretrained=False, device="cpu", cpuinfo=AVX512_BF16).name == "float32"


@pytest.mark.parametrize("setting", ["bf16-mixed", "bfloat16"])
def test_a_bf16_precision_set_on_a_cpu_that_emulates_bf16_is_kept_and_warned_about(setting):
    p = resolve_precision(setting, pretrained=True, device="cpu", cpuinfo=AVX2)
    assert p.name == setting and p.why == "set"  # the config's choice stands: the warning only says what it costs
    assert "emulated" in p.warning and "float32" in p.warning and setting in p.warning
    assert (p.weights, p.autocast) == ((torch.float32, torch.bfloat16) if setting == "bf16-mixed"
                                       else (torch.bfloat16, None))


def test_the_warning_says_how_slow_by_the_cpus_vector_unit():
    # measured on pair A: AVX-512 without BF16 emulates at ~1/3 of fp32's matmul speed, AVX2 crawls (~20x)
    avx512 = resolve_precision("bf16-mixed", pretrained=True, device="cpu", cpuinfo=AVX512_NO_BF16).warning
    avx2 = resolve_precision("bf16-mixed", pretrained=True, device="cpu", cpuinfo=AVX2).warning
    assert "a few times slower" in avx512 and "AVX-512 emulates" in avx512
    assert "many times slower" in avx2 and "~20x" in avx2
    assert all("auto, which picks float32 here" in w for w in (avx512, avx2))


@pytest.mark.parametrize("setting, cpuinfo", [("bf16-mixed", AVX512_BF16), ("bfloat16", AMX), ("float32", AVX2),
                                              ("float16", AVX2)])
def test_no_warning_where_the_cpu_has_fast_bf16_or_the_precision_is_not_bf16(setting, cpuinfo):
    assert resolve_precision(setting, pretrained=True, device="cpu", cpuinfo=cpuinfo).warning == ""


def test_a_compare_runs_warning_lands_in_its_progress_log_and_on_stderr(tmp_path, capsys):
    rep = FileReporter(tmp_path / PROGRESS_FILE)
    rep.phase("[smollm2] loading model (bf16-mixed: set)")
    rep.warn("[smollm2] WARNING: model.dtype bf16-mixed on a CPU without AVX-512 BF16 or AMX")
    lines = (tmp_path / PROGRESS_FILE).read_text().splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == [
        "[smollm2] loading model (bf16-mixed: set)",
        "[smollm2] WARNING: model.dtype bf16-mixed on a CPU without AVX-512 BF16 or AMX"]
    assert "WARNING: model.dtype bf16-mixed" in capsys.readouterr().err
