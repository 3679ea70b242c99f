"""SmolLM2-135M-Instruct's and Qwen2.5-Coder-0.5B-Instruct's configs and tokenizers, without their weights, into
benchmarks/gpu/wheels/<preset>-shape (`make gpu-wheels`): what run_all.py's ``cpu_bf16``, ``vs_trl_cuda`` and
``pair_memory_bf16`` sections build random-weight models from on a lent device, where the weights (0.5 and
2.5 GB as safetensors) do not fit the 64 MiB that travel."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_vs_trl import MODEL_FILES  # noqa: E402

SHAPES = {"smollm2-135m-instruct": "smollm2-135m-shape", "qwen2.5-coder-0.5b-instruct": "qwen2.5-coder-0.5b-shape"}


def main() -> None:
    from mutualrl.models.pretrained import get_model

    for preset, shape in SHAPES.items():
        source = Path(get_model(preset, echo=print))
        out = ROOT / "benchmarks" / "gpu" / "wheels" / shape
        out.mkdir(parents=True, exist_ok=True)
        for name in MODEL_FILES:
            if (source / name).is_file():
                shutil.copy(source / name, out / name)
        print(f"{out}: {', '.join(sorted(p.name for p in out.iterdir()))}")


if __name__ == "__main__":
    main()
