"""``mutualrl thl inspect``: the JSON shape the issue specifies, and clean failures."""

import json
import subprocess
import sys


def test_thl_inspect_json(tmp_path, tokenizers):
    tokenizers["bpe"].save_pretrained(tmp_path / "bpe")
    tokenizers["char"].save_pretrained(tmp_path / "char")
    p = subprocess.run(
        [sys.executable, "-m", "mutualrl.app.cli", "thl", "inspect", "--source", str(tmp_path / "bpe"), "--target", str(tmp_path / "char"), "--text", "12+34=46", "--json"],
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
    p = subprocess.run([sys.executable, "-m", "mutualrl.app.cli", "thl", "inspect", "--source", str(tmp_path / "x"), "--target", str(tmp_path), "--text", "a"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "not a tokenizer directory" in p.stderr
