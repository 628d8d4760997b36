"""The read-ahead budget is bounded by the memory the process has left: a small executor is
not pushed over its limit by a budget sized for a large machine; and the process's memory
stays near what the budget counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from keygroups.errors import OptionError
from reader import memory


@pytest.mark.parametrize(
    "free, wanted, sharers, expected",
    [
        (None, 2 << 30, 1, 2 << 30),  # nothing readable: the budget asked for
        (64 << 30, 2 << 30, 1, 2 << 30),  # plenty: the budget asked for
        (4 << 30, 2 << 30, 1, 1 << 30),  # a quarter of what is left
        (4 << 30, 128 << 20, 16, 64 << 20),  # split over the tasks an executor runs at once
        (1 << 20, 128 << 20, 8, 1 << 20),  # never below 1 MiB: a span of one piece still fits
    ],
)
def test_the_budget_is_a_quarter_of_the_memory_left(monkeypatch, free, wanted, sharers, expected) -> None:
    monkeypatch.setattr(memory, "available_memory", lambda: free)
    assert memory.bounded_read_ahead(wanted, sharers) == expected


def test_the_memory_left_is_read_from_this_machine() -> None:
    free = memory.available_memory()
    assert free is not None and free > 0  # Linux: a cgroup limit or MemAvailable


# In a fresh interpreter: after a 16 MiB buffer is freed (glibc then serves buffers up to that
# size from its arenas), is a 4 MiB buffer mapped from the OS while it lives? Printed as JSON.
LARGE_BUFFER_PROBE = """
import ctypes, json, numpy as np
from reader import memory
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
set_to = memory.map_large_buffers()
big = np.ones(16 << 20, np.uint8)
del big
before = libc.mallinfo2().hblkhd
four = np.ones(4 << 20, np.uint8)
mapped = libc.mallinfo2().hblkhd - before
print(json.dumps({"set": set_to, "mapped": mapped}))
"""


@pytest.mark.parametrize("env, threshold", [({}, memory.MMAP_THRESHOLD_BYTES), ({memory.THRESHOLD_ENV: "0"}, None)])
def test_a_reader_has_large_buffers_mapped_and_given_back_unless_told_not_to(env, threshold) -> None:
    """What keeps a replay's RSS near its read budget: decoded batches of megabytes, freed by
    another thread, go back to the OS instead of staying in glibc's arenas."""
    clean = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", memory.THRESHOLD_ENV)}
    out = subprocess.run(
        [sys.executable, "-c", LARGE_BUFFER_PROBE], env={**clean, **env}, capture_output=True, text=True, check=True
    )
    probe = json.loads(out.stdout)
    assert probe["set"] == threshold
    if threshold:
        assert probe["mapped"] >= 4 << 20  # mapped: unmapped again when freed
    else:
        assert probe["mapped"] == 0  # glibc's default: from an arena, kept there once freed


def test_a_threshold_that_is_no_number_is_refused_naming_the_variable(monkeypatch) -> None:
    monkeypatch.setattr(memory, "_done", False)
    monkeypatch.setenv(memory.THRESHOLD_ENV, "1MiB")
    with pytest.raises(OptionError, match=f"{memory.THRESHOLD_ENV}='1MiB': not a number of bytes"):
        memory.map_large_buffers()
