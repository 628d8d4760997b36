"""Which other `--format` a listing is laid out like: the fix to name when files do not fit
the layout asked for (a Connect archive read with the default format, a broker's log
directory read as Connect files, ...). Each format declares its file names (`layouts`)."""

from __future__ import annotations

import re
from collections.abc import Iterable


def _layouts() -> dict[str, tuple[re.Pattern[str], ...]]:
    # imported here: each source module imports this one for its errors
    from compactor.sources import FORMATS

    return {name: source.layouts for name, source in FORMATS.items()}


def layout_of(keys: Iterable[str], asked: str) -> str | None:
    """The first format other than `asked` whose file names some of `keys` are."""
    layouts = {name: patterns for name, patterns in _layouts().items() if name != asked}
    for key in keys:
        for name, patterns in layouts.items():
            if any(p.match(key) for p in patterns):
                return name
    return None


def hint(keys: Iterable[str], asked: str) -> str:
    """'; it is laid out like --format X' or nothing."""
    found = layout_of(keys, asked)
    return f"; these files are laid out like --format {found}" if found else ""
