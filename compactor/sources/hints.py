"""Which other `--format` a listing is laid out like: the fix to name when files do not fit
the layout asked for (a Connect archive read with the default format, a broker's log
directory read as Connect files, ...). Each format declares its file names (`layouts`).

The formats import this module for their errors, so it imports none of them: the registry
(`compactor.sources`) hands it the formats to choose among once it has listed them
(`register`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from compactor.sources.base import SourceArchive

_formats: Mapping[str, type[SourceArchive]] = {}


def register(formats: Mapping[str, type[SourceArchive]]) -> None:
    """The formats a hint chooses among, by `--format` name: the registry's `FORMATS`, read
    at each hint (not copied)."""
    global _formats
    _formats = formats


def layout_of(keys: Iterable[str], asked: str) -> str | None:
    """The first format other than `asked` whose file names some of `keys` are."""
    layouts = {name: source.layouts for name, source in _formats.items() if name != asked}
    for key in keys:
        for name, patterns in layouts.items():
            if any(p.match(key) for p in patterns):
                return name
    return None


def hint(keys: Iterable[str], asked: str) -> str:
    """'; it is laid out like --format X' or nothing."""
    found = layout_of(keys, asked)
    return f"; these files are laid out like --format {found}" if found else ""
