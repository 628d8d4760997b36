"""The replay's hand-off (reader.slice_merge): slice order kept by the consumer alone, with
real producer threads, small FIFOs and bundles that span slices, several groups a thread."""

from __future__ import annotations

import heapq
import threading
import time

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reader.slice_merge import Bundle, SliceMerge, ThreadFailed
from tests.waits import WAIT_S


def bundle(group: int, slices: list[int]) -> Bundle:
    """One row per piece, naming its group and slice."""
    return Bundle(
        pa.record_batch([pa.array([group * 100 + s for s in slices])], names=["v"]), group, slices, [1] * len(slices)
    )


def produce(merge: SliceMerge, t: int, groups: dict[int, list[int]], cuts: dict[int, set[int]], end: int) -> None:
    """Thread t's groups (each with its slices, increasing), each cut into bundles after the
    positions in its `cuts`, handed over as the replay's threads do: the bundle whose first
    slice is earliest first, `through` the earliest slice some group still has to hand over."""
    runs = {}
    for g, slices in groups.items():
        runs[g], run = [], []
        for i, s in enumerate(slices):
            run.append(s)
            if i in cuts[g] or i == len(slices) - 1:
                runs[g].append(run)
                run = []
    heap = [(r[0][0], g, 0) for g, r in runs.items() if r]
    heapq.heapify(heap)
    while heap:
        _, g, i = heapq.heappop(heap)
        if i + 1 < len(runs[g]):
            heapq.heappush(heap, (runs[g][i + 1][0], g, i + 1))
        merge.put(t, [bundle(g, runs[g][i])], heap[0][0] if heap else end)
    merge.put(t, [], end)


threads = st.lists(  # threads, each with groups, each with its slices
    st.lists(st.sets(st.integers(0, 11), max_size=12).map(sorted), max_size=3), min_size=1, max_size=5
)


@settings(max_examples=150, deadline=None)
@given(streams=threads, capacity=st.integers(1, 3), data=st.data())
def test_every_slice_comes_whole_and_in_order(streams, capacity, data):
    end = 12
    merge = SliceMerge(len(streams), capacity, threading.Event())
    groups = [{10 * t + j: slices for j, slices in enumerate(gs)} for t, gs in enumerate(streams)]
    cuts = [{g: data.draw(st.sets(st.integers(0, 11))) for g in gs} for gs in groups]
    workers = [
        threading.Thread(target=produce, args=(merge, t, gs, c, end), daemon=True)
        for t, (gs, c) in enumerate(zip(groups, cuts))
    ]
    for w in workers:
        w.start()
    out: list[tuple[int, int, int]] = []  # (round, group, slice of the piece)
    for s in range(end):
        for ready in merge.records(s):
            for b in ready:
                k = b.next
                b.next += 1
                assert b.rows[k + 1] == b.rows[k] + 1  # one row per piece
                v = b.batch.column("v")[b.rows[k]].as_py()
                assert v // 100 == b.group
                out.append((s, b.group, v % 100))
    for w in workers:
        w.join(5)
    assert all(piece == s for s, _, piece in out)  # each piece in the round of its own slice
    # every piece once, each group's in its order
    want = sorted((s, g) for gs in groups for g, slices in gs.items() for s in slices)
    assert sorted((s, g) for _, g, s in out) == want
    for gs in groups:
        for g, slices in gs.items():
            assert [s for _, h, s in out if h == g] == slices


def test_a_failed_thread_reaches_a_consumer_waiting_on_another():
    merge = SliceMerge(2, 1, threading.Event())
    merge.put(0, [bundle(0, [0])], 0)  # thread 0 has more of slice 0 to come, and never sends it
    started = time.monotonic()
    threading.Timer(0.2, merge.fail, args=(OSError("GET failed"),)).start()
    with pytest.raises(ThreadFailed) as failed:
        for _ in merge.records(0):
            pass
    assert isinstance(failed.value.error, OSError)
    # reached within a bound, not a claim of speed: 0.2 s idle; a busy machine may take several
    # times that, a consumer left waiting would never return
    assert time.monotonic() - started < 20


def test_a_stopped_replay_releases_producers_and_consumer():
    stop = threading.Event()
    merge = SliceMerge(2, 1, stop)
    merge.put(0, [bundle(0, [0])], 0)
    blocked = threading.Thread(target=merge.put, args=(0, [bundle(1, [0])], 1), daemon=True)
    blocked.start()  # thread 0's FIFO is full: it waits for the consumer
    threading.Timer(0.2, stop.set).start()
    got = [(b.group, b.batch.column("v")[0].as_py() % 100) for ready in merge.records(0) for b in ready]
    # thread 1 never said anything
    blocked.join(WAIT_S)  # released by the stop: at once idle, a while on a busy machine
    assert not blocked.is_alive()
    assert got == [(0, 0), (1, 0)]
    assert not merge.put(1, [bundle(2, [0])], 1)  # after the stop nothing more is taken


def test_a_slice_handed_over_late_is_named_not_reordered():
    """A thread that hands over a piece of a slice the consumer has already finished is a bug
    in the replay: it surfaces as such instead of a record out of slice order."""
    merge = SliceMerge(1, 2, threading.Event())
    merge.put(0, [bundle(0, [0])], 1)
    assert [b.group for ready in merge.records(0) for b in ready] == [0]
    merge.put(0, [bundle(1, [0, 1])], 2)
    with pytest.raises(ThreadFailed, match="slice 0 late"):
        list(merge.records(1))
