"""The replay's hand-off (reader.slice_merge): slice order kept by the consumer alone, with
real producer threads, small FIFOs and bundles that span slices."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reader.slice_merge import SliceMerge, ThreadFailed


@dataclass(frozen=True)
class Item:
    slice: int
    thread: int
    seq: int


def produce(merge: SliceMerge, t: int, slices: list[int], cuts: set[int], end: int) -> None:
    """Thread t's items (one per entry of `slices`, in order), handed over in bundles cut
    after the positions in `cuts`; `through` is the slice of the next item, as the replay's
    threads say it."""
    bundle: list[Item] = []
    for i, s in enumerate(slices):
        bundle.append(Item(s, t, i))
        if i in cuts:
            merge.put(t, bundle, s)
            bundle = []
    merge.put(t, bundle, end)


streams = st.lists(st.lists(st.integers(0, 11), max_size=25).map(sorted), min_size=1, max_size=5)


@settings(max_examples=150, deadline=None)
@given(streams=streams, capacity=st.integers(1, 3), data=st.data())
def test_every_slice_comes_whole_and_in_order(streams, capacity, data):
    end = 12
    merge = SliceMerge(len(streams), capacity, threading.Event())
    cuts = [data.draw(st.sets(st.integers(0, 24))) for _ in streams]
    workers = [
        threading.Thread(target=produce, args=(merge, t, s, c, end), daemon=True)
        for t, (s, c) in enumerate(zip(streams, cuts))
    ]
    for w in workers:
        w.start()
    out: list[tuple[int, Item]] = []
    for s in range(end):
        for ready in merge.records(s):
            out += [(s, item) for item in ready]
    for w in workers:
        w.join(5)
    assert all(item.slice == s for s, item in out)  # each item in the round of its own slice
    assert [item.slice for _, item in out] == sorted(item.slice for _, item in out)
    for t, stream in enumerate(streams):  # every item once, each thread's in its order
        assert [item.seq for _, item in out if item.thread == t] == list(range(len(stream)))


def test_a_failed_thread_reaches_a_consumer_waiting_on_another():
    merge = SliceMerge(2, 1, threading.Event())
    merge.put(0, [Item(0, 0, 0)], 0)  # thread 0 has more of slice 0 to come, and never sends it
    started = time.monotonic()
    threading.Timer(0.2, merge.fail, args=(OSError("GET failed"),)).start()
    with pytest.raises(ThreadFailed) as failed:
        for _ in merge.records(0):
            pass
    assert isinstance(failed.value.error, OSError)
    assert time.monotonic() - started < 2


def test_a_stopped_replay_releases_producers_and_consumer():
    stop = threading.Event()
    merge = SliceMerge(2, 1, stop)
    merge.put(0, [Item(0, 0, 0)], 0)
    blocked = threading.Thread(target=merge.put, args=(0, [Item(0, 0, 1)], 1), daemon=True)
    blocked.start()  # thread 0's FIFO is full: it waits for the consumer
    threading.Timer(0.2, stop.set).start()
    got = [item for ready in merge.records(0) for item in ready]  # thread 1 never says anything
    blocked.join(2)
    assert not blocked.is_alive()
    assert got == [Item(0, 0, 0), Item(0, 0, 1)]
    assert not merge.put(1, [Item(0, 1, 0)], 1)  # after the stop nothing more is taken
