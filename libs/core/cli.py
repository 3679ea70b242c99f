"""The ``mutualrl`` command line.

Bad input (a malformed file, an unknown mode, a wrong type, a missing path)
prints one line naming the problem and exits with code 2 — never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from mutualrl.config import ConfigError, load_config

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Mutual RL: heterogeneous policies learning together.")
err = Console(stderr=True)
out = Console()

EXIT_BAD_INPUT = 2


def _fail(message: str) -> "typer.Exit":
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(EXIT_BAD_INPUT)


@app.command()
def validate(
    config: Path = typer.Argument(..., help="Experiment YAML file."),
    set_: List[str] = typer.Option([], "--set", help="Override a field: key.path=value (repeatable)."),
) -> None:
    """Check an experiment file against the schema without running it."""
    try:
        cfg = load_config(config, set_)
    except ConfigError as e:
        raise _fail(str(e))
    out.print(f"[green]ok[/] {config}: {len(cfg.policies)} policies ({', '.join(p.name for p in cfg.policies)}), sharing={cfg.sharing.mode}, steps={cfg.budget.steps}")


@app.command()
def run(
    config: Path = typer.Argument(..., help="Experiment YAML file."),
    set_: List[str] = typer.Option([], "--set", help="Override a field: key.path=value (repeatable)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Output directory (default: <output_dir>/<name>)."),
) -> None:
    """Run an experiment (embedded launcher: every worker in this process)."""
    try:
        cfg = load_config(config, set_)
    except ConfigError as e:
        raise _fail(str(e))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from mutualrl.runtime.display import LiveReporter
    from mutualrl.runtime.embedded import run_embedded

    target = out_dir or Path(cfg.output_dir) / cfg.name
    try:
        with LiveReporter(cfg) as reporter:
            summary = run_embedded(cfg, target, reporter)
    except ConfigError as e:  # inputs that failed to load; any other error is a bug and keeps its traceback
        raise _fail(str(e))
    out.print(f"[bold]done[/] → {target}")
    for name, p in summary["policies"].items():
        out.print(f"  {name}: accuracy {p['warm_start_accuracy']:.1%} → {p['final_accuracy']:.1%}, rescues {p['rescue_count']}")


thl_app = typer.Typer(no_args_is_help=True, help="Tokenizer Heterogeneity Layer tools.")
app.add_typer(thl_app, name="thl")


@thl_app.command("inspect")
def thl_inspect(
    source: Path = typer.Option(..., "--source", help="Source tokenizer directory."),
    target: Path = typer.Option(..., "--target", help="Target tokenizer directory."),
    text: str = typer.Option(..., "--text", help="Text to carry from source to target."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Show both tokenizations of TEXT, their byte-aligned groups and the residual."""
    from mutualrl.models import load_tokenizer
    from mutualrl.thl.inspect_cli import inspect_text, render_text

    toks = []
    for label, path in (("--source", source), ("--target", target)):
        if not path.is_dir():
            raise _fail(f"{label} {path}: not a tokenizer directory")
        try:
            toks.append(load_tokenizer(path))
        except (OSError, ValueError) as e:
            raise _fail(f"{label} {path}: cannot load a tokenizer ({str(e).splitlines()[0]})")
    report = inspect_text(toks[0], toks[1], text)
    if as_json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        out.print(render_text(report), highlight=False, markup=False)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
