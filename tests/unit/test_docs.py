"""Docstrings cite the repo's own documents: every `docs/….md §N` a module cites names a section
that exists, and nothing cites a file outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = [p for d in ("libs", "services", "app", "benchmarks", "tests") for p in (ROOT / d).rglob("*.py")]


def _sections(doc: Path) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", doc.read_text(), re.M)}


def test_cited_sections_exist():
    missing = []
    for path in CODE:
        text = path.read_text()
        for m in re.finditer(r"docs/(\w+)\.md((?:[ ,;–-]*§\d+(?:\.\d+)?)+)", text):
            doc = ROOT / "docs" / f"{m.group(1)}.md"
            assert doc.is_file(), f"{path.relative_to(ROOT)} cites docs/{m.group(1)}.md, which does not exist"
            for sec in re.findall(r"§(\d+(?:\.\d+)?)", m.group(2)):
                if sec not in _sections(doc):
                    missing.append(f"{path.relative_to(ROOT)}: docs/{m.group(1)}.md §{sec}")
    assert not missing, missing


def test_nothing_cites_a_file_outside_the_repo():
    outside = [str(p.relative_to(ROOT)) for p in CODE if p.name != "test_docs.py"
               and re.search(r"\bshared/|(?<!docs/)\b(design|engines|environment|style)\.md|(?<!docs/)\balgorithms\.md",
                             p.read_text())]
    assert not outside, outside
