"""Argument types and output formats shared by the subcommands."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone


def iso(ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC; out of datetime's range, the number itself."""
    try:
        return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"
    except (ValueError, OverflowError, OSError):
        return f"{ms} ms"


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction in [0, 1]")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def iso_ms(text: str) -> int:
    """An ISO 8601 time (UTC unless it says otherwise) as epoch milliseconds."""
    try:
        start = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time like 2026-01-01T00:00:00Z") from None
    if start.tzinfo is None:
        start = start.replace(tzinfo=timezone.utc)
    return int(start.timestamp() * 1000)


def time_ms(text: str) -> int:
    """Epoch milliseconds, given as such (as Spark's Kafka source takes them) or as an ISO 8601 time."""
    try:
        return int(text)
    except ValueError:
        return iso_ms(text)


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9}
_UNITS |= {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def byte_size(text: str) -> int:
    """A size in bytes: 67108864, 64MiB, 64MB, 1GiB (case-insensitive)."""
    t = text.strip().lower()
    digits = len(t) - len(t.lstrip("0123456789"))
    unit = t[digits:].strip()
    if not digits or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 67108864, 64MiB or 1GB")
    return int(t[:digits]) * _UNITS[unit]
