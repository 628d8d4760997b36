"""How much read-ahead this process can afford: the memory it has left, read where a
container or a cluster manager sets the limit; and the allocator setting that keeps the
process's memory near what the budget counts."""

from __future__ import annotations

import ctypes
import os
import platform
import threading

from keygroups.errors import OptionError

# glibc's mallopt parameter for the mmap threshold (<malloc.h>: M_MMAP_THRESHOLD is -3)
M_MMAP_THRESHOLD = -3
# Allocations of at least this many bytes are mapped from the OS and unmapped when freed.
MMAP_THRESHOLD_BYTES = 1 << 20
THRESHOLD_ENV = "KEYFILL_MMAP_THRESHOLD"  # bytes; 0 leaves the allocator as it is
_mapped = threading.Lock()
_done = False


def available_memory() -> int | None:
    """Bytes this process may still use: the cgroup's limit less its usage where one is set
    (a container, a YARN or Kubernetes executor), else the machine's MemAvailable; None if
    neither can be read."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                return max(0, int(limit) - int(f.read()))
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def bounded_read_ahead(wanted: int, sharers: int = 1) -> int:
    """`wanted`, but no more than a quarter of the available memory split between `sharers`
    readers (the tasks an executor has at once): a small executor is not pushed over its
    limit by a budget sized for a large machine."""
    free = available_memory()
    if free is None:
        return wanted
    return min(wanted, max(1 << 20, free // (4 * max(1, sharers))))


def map_large_buffers() -> int | None:
    """Have glibc map buffers of MMAP_THRESHOLD_BYTES and more from the OS and give them back
    when freed; once per process, called where a replay opens (not in a Spark task: there
    its decode spent 15-20% more CPU a row with it, 0.62-0.70 us against 0.53-0.65). Returns
    the threshold set, or None where nothing was set.

    Why: the reader's decoded batches and decode buffers are megabytes each, allocated by
    one thread and freed by another. By default glibc raises its mmap threshold to the size
    of the first large buffer freed, after which such buffers come from per-thread arenas,
    and what they free stays in them: a 64 MiB read-ahead replay with a slow consumer kept
    ~300 MB freed in arenas, peaking ~270 MB over its warmed-up RSS; with the threshold
    fixed, ~130 MB, at the same CPU per record (docs/performance.md#large-buffers-mapped).

    Not set where the user chose: glibc's own MALLOC_MMAP_THRESHOLD_ in the environment,
    or KEYFILL_MMAP_THRESHOLD (bytes; 0: leave the allocator alone). mallopt is called
    through ctypes: it is glibc's API, which no maintained Python package wraps; other C
    libraries (musl, macOS) are left alone."""
    global _done
    with _mapped:
        if _done:
            return None
        wanted = os.environ.get(THRESHOLD_ENV, "").strip()
        try:
            threshold = int(wanted) if wanted else MMAP_THRESHOLD_BYTES
        except ValueError:
            raise OptionError(
                f"{THRESHOLD_ENV}={wanted!r}: not a number of bytes (0: leave the allocator alone)"
            ) from None
        _done = True
        if "MALLOC_MMAP_THRESHOLD_" in os.environ or threshold <= 0 or platform.libc_ver()[0] != "glibc":
            return None
        try:
            set_ok = ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, threshold)
        except (OSError, AttributeError):
            return None
        return threshold if set_ok == 1 else None
