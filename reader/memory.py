"""How much read-ahead this process can afford: the memory it has left, read where a
container or a cluster manager sets the limit."""

from __future__ import annotations


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
