"""Name -> item (function or spec) registries whose lookup errors list every valid name (verl style)."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

F = TypeVar("F")


class Registry(Generic[F]):
    """Named implementations (losses, advantage estimators) looked up from config strings."""
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """A decorator registering its function (or class) under ``name``; a name registered twice is an error."""
        def deco(fn: F) -> F:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = fn
            return fn

        return deco

    def get(self, name: str) -> F:
        """The item registered under ``name``; the error lists every valid name."""
        if name not in self._items:
            raise ValueError(f"unknown {self.kind} {name!r}; valid: {', '.join(sorted(self._items))}")
        return self._items[name]

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
