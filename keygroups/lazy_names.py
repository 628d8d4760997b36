"""A package's public names imported on first use (PEP 562's module `__getattr__`): `import
reader` or `import keyfill.testing` then loads none of what the names need (pyarrow, numba,
hypothesis, pyspark) until one is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def names_from(namespace: dict[str, Any], where: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` giving each name of `where` from the module it maps to, imported
    once and kept in `namespace` (the package's globals())."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = namespace[name] = getattr(importlib.import_module(where[name]), name)
        return value

    return __getattr__
