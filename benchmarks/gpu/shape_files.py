"""SmolLM2-135M-Instruct's config and tokenizer, without its weights, into benchmarks/gpu/wheels/ (`make
gpu-wheels`): what run_all.py's ``cpu_bf16`` and ``vs_trl_cuda`` sections build a random-weight SmolLM2 from
on a lent device, where the weights (94 MB as GGUF, 0.5 GB as safetensors) do not fit the 64 MiB that travel."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_vs_trl import MODEL_FILES  # noqa: E402


def main() -> None:
    from mutualrl.models.pretrained import get_model

    source = Path(get_model("smollm2-135m-instruct", echo=print))
    out = ROOT / "benchmarks" / "gpu" / "wheels" / "smollm2-135m-shape"
    out.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, out / name)
    print(f"{out}: {', '.join(sorted(p.name for p in out.iterdir()))}")


if __name__ == "__main__":
    main()
