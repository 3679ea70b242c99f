"""The conversion of one model into a checked cache folder, run as a child interpreter by
``mutualrl.models.pretrained.get_model`` (why a child: that module's docstring).

``python -m mutualrl.models.convert gguf FILE --name NAME --cache DIR [--meta JSON]`` or
``... folder SOURCE ...``: progress on stderr, the folder on the last stdout line, exit 2 with one
``error: …`` line on stderr when the input cannot be converted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mutualrl.models.pretrained import ModelImportError, import_folder, import_gguf


def main(argv: list[str] | None = None) -> int:
    """Convert, print the folder; one error line and exit 2 on bad input."""
    ap = argparse.ArgumentParser(prog="python -m mutualrl.models.convert")
    ap.add_argument("kind", choices=("gguf", "folder"))
    ap.add_argument("source")
    ap.add_argument("--name", required=True)
    ap.add_argument("--cache", required=True, type=Path)
    ap.add_argument("--meta", default="{}")
    a = ap.parse_args(argv)

    def echo(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    meta = json.loads(a.meta)
    try:
        if a.kind == "gguf":
            folder = import_gguf(Path(a.source), a.name, a.cache, echo, meta=meta)
        else:
            folder = import_folder(a.source, a.name, a.cache, echo, meta=meta)
    except ModelImportError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    print(folder, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
