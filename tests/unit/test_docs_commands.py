"""Every `mutualrl` command the docs, the README, the deploy files and the examples name exists: the first word
is a command or a group of the CLI, and after a group the next word is one of its commands (a misspelt or
removed command in the docs is a user's first dead end)."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from mutualrl.app.cli import app

ROOT = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"(?:^|[`$(]|\$ )\s*mutualrl ([a-z][a-z-]*)(?: +([a-z][a-z-]*))?", re.MULTILINE)
IN_CODE = re.compile(r"`mutualrl ([a-z][a-z-]*)(?: +([a-z][a-z-]*))?")


def _named(path: Path):
    """The (command, next word) pairs ``path`` names: in Markdown, in code spans, fenced blocks and indented
    blocks only (prose may say "mutualrl trains ..."); elsewhere, anywhere a command line could start."""
    text = path.read_text()
    if path.suffix != ".md":
        yield from (m.groups() for m in NAMED.finditer(text))
        return
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        pattern = NAMED if fenced or line.startswith("    ") else IN_CODE
        yield from (m.groups() for m in pattern.finditer(line))


def _documents() -> list[Path]:
    files = [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("deploy/**/*.example"),
             *ROOT.glob("deploy/**/*.yaml"), *ROOT.glob("deploy/**/*.yml"), *ROOT.glob("examples/**/*.yaml"),
             ROOT / "Makefile", *ROOT.glob("deploy/**/Dockerfile*")]
    return [f for f in files if f.is_file()]


def test_every_command_the_docs_name_exists():
    cli = typer.main.get_command(app)
    assert hasattr(cli, "commands")  # a group (typer's own click)
    seen, missing = 0, []
    for path in _documents():
        for command, sub in _named(path):
            seen += 1
            found = cli.commands.get(command)
            if found is None:
                missing.append(f"{path.relative_to(ROOT)}: mutualrl {command}")
            elif hasattr(found, "commands") and sub is not None and sub not in found.commands:
                missing.append(f"{path.relative_to(ROOT)}: mutualrl {command} {sub}")
    assert seen > 50  # the docs name many commands: the pattern finds them
    assert not missing, missing
