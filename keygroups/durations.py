"""Durations in options: keyfill's short form (`10m`, `1h`) and Spark's interval words
(`10 minutes`, as `withWatermark` takes them), so a value copied from a Spark job reads the same."""

from __future__ import annotations

import re

from keygroups.errors import OptionError

_UNITS = {
    "ms": 1,
    "millisecond": 1,
    "s": 1000,
    "second": 1000,
    "m": 60_000,
    "min": 60_000,
    "minute": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
}
_DURATION = re.compile(r"\s*(\d+)\s*(ms|s|min|m|h|d|(?:millisecond|second|minute|hour|day)s?)\s*", re.IGNORECASE)


def parse_duration(text: str, option: str = "--slice-duration") -> int:
    """'10m', '1h', '90s', '500ms', '1d', '10 minutes', '1 hour' -> milliseconds."""
    m = _DURATION.fullmatch(text)
    if not m or int(m[1]) == 0:
        raise OptionError(f"{option} {text!r}: expected a positive duration like 500ms, 90s, 10m, 1h, 1d or 10 minutes")
    unit = m[2].lower()
    return int(m[1]) * _UNITS[unit if unit in _UNITS else unit.rstrip("s")]
