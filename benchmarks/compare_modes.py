"""Every sharing mode against isolated GRPO: a thin call of `mutualrl compare` (app/src/mutualrl/app/compare.py).

    .venv/bin/python benchmarks/compare_modes.py [SPEC] [--quick] [--jobs 2] [--out DIR]

SPEC defaults to the evidence suite (examples/evidence/compare.yaml: 8 entries x 2 heterogeneous
pairs x 5 seeds; ``--quick`` its 15-minute profile). Resumable; prints the report: held-out
accuracy as mean ± 95 % CI over seeds, rollouts to the baseline's final accuracy, paired
differences against isolated GRPO on the same seeds.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from mutualrl.app.cli import app

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPEC = ROOT / "examples" / "evidence" / "compare.yaml"


def main(argv: list[str]) -> None:
    if not argv or argv[0].startswith("-"):
        argv = [str(DEFAULT_SPEC), *argv]
    if "--out" not in argv:
        argv += ["--out", str(ROOT / "runs" / ("compare-modes-quick" if "--quick" in argv else "compare-modes"))]
    t0 = time.monotonic()
    app(["compare", *argv], standalone_mode=False)
    report = Path(argv[argv.index("--out") + 1]) / "report.md"
    print(report.read_text())
    print(f"wall {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
