"""``mutualrl thl inspect``: the JSON shape the issue specifies, and clean failures."""

import json
import subprocess
import sys


def test_thl_inspect_json(tmp_path, tokenizers):
    tokenizers["bpe"].save_pretrained(tmp_path / "bpe")
    tokenizers["char"].save_pretrained(tmp_path / "char")
    p = subprocess.run(
        [sys.executable, "-m", "mutualrl.app.cli", "thl", "inspect", "--source", str(tmp_path / "bpe"), "--target",
         str(tmp_path / "char"), "--text", "12+34=46", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["target_ids"] == tokenizers["char"]("12+34=46", add_special_tokens=False)["input_ids"]
    assert report["source_ids"] == tokenizers["bpe"]("12+34=46", add_special_tokens=False)["input_ids"]
    spans = [g["bytes"] for g in report["groups"]]
    assert spans[0][0] == 0 and spans[-1][1] == 8 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert report["residual"]["unaligned_fraction"] == 0.0 and report["residual"]["roundtrip_ok"] is True


def test_thl_inspect_bad_directory(tmp_path):
    p = subprocess.run([sys.executable, "-m", "mutualrl.app.cli", "thl", "inspect", "--source", str(tmp_path / "x"),
                        "--target", str(tmp_path), "--text", "a"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "not a tokenizer directory" in p.stderr


def _inspect(*args):
    return subprocess.run([sys.executable, "-m", "mutualrl.app.cli", "thl", "inspect", *args], capture_output=True,
                          text=True, timeout=120)


def test_thl_inspect_reports_text_a_vocabulary_cannot_spell(tmp_path, tokenizers):
    """A char vocabulary trained on sums has no letters: the letters become <unk>, and decoding skips
    them ('12+3446' was printed with roundtrip_ok true and unaligned 0). Now the loss is reported."""
    tokenizers["char"].save_pretrained(tmp_path / "char")
    tokenizers["bpe"].save_pretrained(tmp_path / "bpe")
    text = "What is 12+34? Answer: 46"
    p = _inspect("--source", str(tmp_path / "char"), "--target", str(tmp_path / "bpe"), "--text", text, "--json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["source_spells_text"] is False and report["source_unk_tokens"] > 0
    assert set("What") <= set(report["source_lost_chars"]) and report["carried_text"] != text
    assert report["residual"]["roundtrip_ok"] is False
    lost = len(text.encode()) - len(report["carried_text"].encode())
    assert report["residual"]["unaligned_fraction"] >= lost / len(text.encode()) > 0.3
    shown = _inspect("--source", str(tmp_path / "char"), "--target", str(tmp_path / "bpe"), "--text", text)
    assert shown.returncode == 0 and "WARNING: the source tokenizer cannot spell this text" in shown.stdout


def test_thl_inspect_names_the_folders_that_hold_a_tokenizer(tmp_path, tokenizers):
    run = tmp_path / "run"
    tokenizers["char"].save_pretrained(run / "checkpoints" / "llama-char")
    p = _inspect("--source", str(run), "--target", str(run / "checkpoints" / "llama-char"), "--text", "1+2=3")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "holds no tokenizer" in p.stderr and str(run / "checkpoints" / "llama-char") in p.stderr.replace("\n", "")
