"""The read-ahead budget is bounded by the memory the process has left: a small executor is
not pushed over its limit by a budget sized for a large machine."""

from __future__ import annotations

import pytest

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
