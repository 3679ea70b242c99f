"""Read, override, validate and write experiment files with one-line errors.

Every failure becomes a :class:`ConfigError` whose message is one line naming
the file, the field path and the problem; the CLI prints it and exits 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from mutualrl.config.schema import ExperimentConfig


class ConfigError(ValueError):
    """A problem with an experiment file or override, phrased for the person who wrote it."""


def _format_validation(err: ValidationError, source: str) -> str:
    parts = []
    for e in err.errors()[:3]:
        loc = ".".join(str(x) for x in e["loc"] if not str(x).startswith("function-"))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "literal_error":
            msg = f"{msg} (got {e.get('input')!r})"
        elif e["type"] == "string_type" and isinstance(e.get("input"), dict):
            # YAML reads unquoted text with ": " in it as a mapping: say so, or the line reads as nonsense
            msg = (f"{msg}, got a mapping: text with ': ' in it reads as YAML's key: value; put it in quotes "
                   "(in a file: field: \"text\"; on the command line: --set 'field=\"text\"')")
        parts.append(f"{loc}: {msg}" if loc else msg)
    more = f" (+{len(err.errors()) - 3} more)" if len(err.errors()) > 3 else ""
    return f"{source}: " + "; ".join(parts) + more


def _parse_scalar(text: str) -> Any:
    """Override values are YAML scalars/flow values: `3`, `1e-4`, `true`, `[a, b]`, `null`."""
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply ``key.path=value`` overrides; list items are addressed by index or policy name.

    ``policies.0.optim.lr=1e-3`` and ``policies.llama-char.optim.lr=1e-3`` both work.
    """
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key.path=value")
        key, value = item.split("=", 1)
        path = [p for p in key.strip().split(".") if p]
        if not path:
            raise ConfigError(f"--set {item!r}: empty key")
        node: Any = raw
        for i, part in enumerate(path[:-1]):
            node = _child(node, part, path[: i + 1], item, create=True)
        last = path[-1]
        if isinstance(node, list):
            idx = _list_index(node, last, item)
            node[idx] = _parse_scalar(value)
        elif isinstance(node, dict):
            node[last] = _parse_scalar(value)
        else:
            raise ConfigError(f"--set {item!r}: {'.'.join(path[:-1])} is not a mapping")
    return raw


def _list_index(node: list, part: str, item: str) -> int:
    if part.isdigit() and int(part) < len(node):
        return int(part)
    for i, el in enumerate(node):
        if isinstance(el, dict) and el.get("name") == part:
            return i
    raise ConfigError(f"--set {item!r}: no list item {part!r}")


def _child(node: Any, part: str, so_far: list[str], item: str, create: bool) -> Any:
    if isinstance(node, list):
        return node[_list_index(node, part, item)]
    if not isinstance(node, dict):
        raise ConfigError(f"--set {item!r}: {'.'.join(so_far[:-1])} is not a mapping")
    if part not in node or node[part] is None:
        if not create:
            raise ConfigError(f"--set {item!r}: no field {'.'.join(so_far)}")
        node[part] = {}
    return node[part]


def load_config(path: str | Path, overrides: list[str] | None = None, check_paths: bool = True) -> ExperimentConfig:
    """Read, override (``a.b=value``) and validate an experiment file; every problem is one ``ConfigError`` line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file") from None
    return parse_config(text, str(path), overrides, check_paths)


def parse_config(text: str, source: str = "<config>", overrides: list[str] | None = None,
                 check_paths: bool = True) -> ExperimentConfig:
    """The same validation as a file, for YAML that arrives another way (the control API)."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{source}: malformed YAML{where}: {problem}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(raw).__name__}")
    raw = apply_overrides(raw, overrides or [])
    try:
        cfg = ExperimentConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_validation(e, source)) from None
    if check_paths:
        try:
            cfg.check_paths()
        except ValueError as e:
            raise ConfigError(f"{source}: {e}") from None
    return cfg


def dump_config(cfg: ExperimentConfig, path: str | Path) -> None:
    """Write the fully resolved config (defaults included) so a run can be reproduced from it."""
    Path(path).write_text(yaml.safe_dump(cfg.model_dump(mode="json", by_alias=True), sort_keys=False), encoding="utf-8")
