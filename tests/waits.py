"""Waiting in tests without assuming the machine's speed: a test that needs something to have
happened (a thread blocked, a renewal written, threads gone) waits until it has, within a
bound many times what it takes on an idle machine, instead of sleeping a guessed time and
checking once (CONTRIBUTING.md, "The suite")."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

# Generous on purpose: what these waits stand for takes well under a second on two idle
# cores; a busy machine (load 10-15 on 2 cores) may be 10x slower; only a hang takes longer.
WAIT_S = 60.0


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> None:
    """Return as soon as `condition()` is true; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not so after {timeout_s:.0f} s")
        time.sleep(0.02)


def connected_to(pid: int, port: int) -> bool:
    """Whether process `pid` holds a TCP connection to `port` on this machine (Linux /proc):
    a command waiting on a server, rather than still starting."""
    sockets = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            sockets.add(link[len("socket:[") : -1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            rows = [line.split() for line in f.readlines()[1:]]
        # columns: sl, local address, remote address (hex ip:port), state, ..., inode (10th)
        if any(int(row[2].rsplit(":", 1)[1], 16) == port and row[9] in sockets for row in rows):
            return True
    return False
