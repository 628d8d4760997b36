"""The limits of every numeric option, in one place, checked where options are built (before
any Spark job or thread starts) with the limit in the message.

The limits are far above what works well and well below what breaks: a thread is a real
OS thread with its own read-ahead, so 100,000 of them abort the process; a group is a
segment file per target size and an index row per slice, and group ids are five digits in
file names.
"""

from __future__ import annotations

from keygroups.errors import OptionError

DAY_MS = 86_400_000
MAX_THREADS = 1024
MAX_GROUPS = 65_536
MAX_DURATION_MS = 366 * DAY_MS  # a slice, an idle window, a watermark bound or a drift bound
MAX_BATCH_ROWS = 1 << 24
MAX_BLOCK_BYTES = 64 << 20
MAX_TARGET_FILE_BYTES = 64 << 30
MAX_RANGE_BYTES = 1 << 30
MAX_READ_AHEAD_BYTES = 1 << 40


def within(option: str, value: int, low: int, high: int, why: str = "", *, written: str | None = None) -> int:
    """`value`, or OptionError naming the option, the value (as `written`, the text it was
    parsed from, where it had one) and the allowed range."""
    if not low <= value <= high:
        shown = f"={written!r}" if written is not None else f" {value:,}"
        raise OptionError(f"{option}{shown}: must be between {low:,} and {high:,}" + (f" ({why})" if why else ""))
    return value
