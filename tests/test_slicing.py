"""Slicing by running-maximum timestamp: checked against a per-record brute force, and the
watermark rule of docs/design.md (invariant 3) as a property."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.errors import NothingSealed, SlicingError
from compactor.slicing import ChunkStats, Continuation, chunk_stretches, plan_slices, record_slices
from keygroups.durations import parse_duration


@st.composite
def partitions(draw):
    """Per partition: timestamps in offset order (jittered, with jumps), cut into chunks."""
    out = {}
    for p in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 80))
        steps = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
        jitter = draw(st.lists(st.integers(0, 120), min_size=n, max_size=n))
        jump = draw(st.integers(0, 1000))
        base = np.cumsum(steps) + draw(st.integers(-500, 500))
        base[n // 2 :] += jump  # an idle stretch: makes empty slices
        ts = (base - np.array(jitter)).astype(np.int64)
        cuts = sorted(set(draw(st.lists(st.integers(1, max(1, n - 1)), max_size=4))) - {n})
        out[p] = (ts, [0, *cuts, n])
    return out


def stats_for(parts, duration):
    chunks = []
    for p, (ts, cuts) in parts.items():
        for a, b in zip(cuts, cuts[1:]):
            offs = np.arange(a, b, dtype=np.int64) + 1000 * p
            chunks.append(
                ChunkStats(
                    key=f"p{p}-{a}",
                    topic="t",
                    partition=p,
                    first_offset=int(offs[0]),
                    last_offset=int(offs[-1]),
                    records=b - a,
                    min_timestamp=int(ts[a:b].min()),
                    max_timestamp=int(ts[a:b].max()),
                    stretches=chunk_stretches(offs, ts[a:b], duration),
                )
            )
    return chunks


@settings(max_examples=500, deadline=None)
@given(parts=partitions(), duration=st.integers(1, 300), bound=st.integers(0, 200))
def test_slices_follow_the_running_maximum_and_keep_watermarks_safe(parts, duration, bound):
    chunks = stats_for(parts, duration)
    plan = plan_slices(chunks, duration, seal_all=True)
    for p, (ts, cuts) in parts.items():
        # brute force: slice of every record from its partition's running maximum
        expect = np.maximum.accumulate(ts) // duration - plan.base
        got = np.concatenate(
            [
                record_slices(ts[a:b], plan.prefix_max[f"p{p}-{a}"], duration, plan.base)[0]
                for a, b in zip(cuts, cuts[1:])
            ]
        )
        assert got.tolist() == expect.tolist()
        assert (np.diff(got) >= 0).all()  # slices are contiguous offset ranges
        for s in np.unique(got).tolist():
            (r,) = [r for r in plan.ranges[s] if r.partition == p]
            offs = np.flatnonzero(got == s) + 1000 * p
            assert (r.first_offset, r.last_offset, r.records) == (offs[0], offs[-1], len(offs))
        # invariant 3: a record emitted after slice s's watermark (end of s - bound) with a
        # timestamp below it was already late in its partition's own order
        runmax_before = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(ts)[:-1]])
        for s in range(plan.slices):
            watermark = plan.bounds(s)[1] - bound
            later = got > s
            late_in_replay = later & (ts < watermark)
            late_originally = ts < runmax_before - bound
            assert not (late_in_replay & ~late_originally).any()
    assert plan.slices == max(plan.ranges) + 1 and min(plan.ranges) == 0
    assert sum(r.records for rs in plan.ranges.values() for r in rs) == sum(len(ts) for ts, _ in parts.values())
    assert all(plan.bounds(s)[1] - plan.bounds(s)[0] == duration for s in range(plan.slices))


@settings(max_examples=500, deadline=None)
@given(parts=partitions(), duration=st.integers(1, 300), data=st.data())
def test_sealed_slices_are_final_whatever_the_source_adds_later(parts, duration, data):
    """Compact a prefix of every partition (a lagging partition: a short prefix), then the
    whole source at once: the slices the prefix published are exactly the whole source's
    slices, and the hand-off points at each partition's first unpublished record."""
    prefix = {}
    for p, (ts, cuts) in parts.items():
        k = data.draw(st.integers(1, len(ts)), label=f"prefix of partition {p}")
        inside = [c for c in cuts if c < k]
        prefix[p] = (ts[:k], [*inside, k])
    whole = plan_slices(stats_for(parts, duration), duration, seal_all=True)
    try:
        plan = plan_slices(stats_for(prefix, duration), duration)
    except SlicingError as e:
        assert "no slice is sealed yet" in str(e)
        first_max = min(int(np.max(ts)) for ts, _ in prefix.values()) // duration
        assert first_max == whole.base  # a partition's running maximum is still in the first slice
        return
    assert plan.base == whole.base and 0 < plan.slices <= whole.slices
    for s in range(plan.slices):  # invariant 7: as if the grown source had been compacted at once
        assert plan.ranges.get(s, []) == whole.ranges.get(s, [])
    withheld = 0
    for p, (ts, _) in prefix.items():
        slices = np.maximum.accumulate(ts) // duration - plan.base  # the prefix is a prefix: same running max
        published = slices < plan.slices
        assert (np.diff(published.astype(int)) <= 0).all()  # published records come first
        n = int(published.sum())
        assert plan.handoff[p] == 1000 * p + n
        if n:
            assert plan.running_max[p] == int(ts[:n].max())
        withheld += len(ts) - n
        # the partition's last running maximum is at or past the seal: nothing later can land before it
        assert int(np.max(ts)) // duration - plan.base >= plan.slices
    assert plan.withheld == withheld


def stats_between(parts, lo, hi, duration):
    """ChunkStats of each partition's records [lo[p], hi[p]) (positions), cut where the source's
    chunks are cut: what an append's statistics pass sees from the hand-off on."""
    chunks = []
    for p, (ts, cuts) in parts.items():
        bounds = sorted({lo[p], hi[p], *[c for c in cuts if lo[p] < c < hi[p]]})
        for a, b in zip(bounds, bounds[1:]):
            offs = np.arange(a, b, dtype=np.int64) + 1000 * p
            chunks.append(
                ChunkStats(
                    f"p{p}-{a}",
                    "t",
                    p,
                    int(offs[0]),
                    int(offs[-1]),
                    b - a,
                    int(ts[a:b].min()),
                    int(ts[a:b].max()),
                    chunk_stretches(offs, ts[a:b], duration),
                )
            )
    return chunks


@settings(max_examples=500, deadline=None)
@given(parts=partitions(), duration=st.integers(1, 300), idle=st.sampled_from([None, 0, 50, 400]), data=st.data())
def test_appends_publish_every_record_once_in_slices_of_the_whole_source(parts, duration, idle, data):
    """The source grows in k steps (each partition by its own amount: lagging and idle
    partitions), each step appended to the last plan. Without idleness every published
    slice equals the one-shot compaction's (invariant 7); with it, a record is placed after
    its own running maximum's slice only when counted as made late, and only into the first
    slice of its append. Every record is published at most once, in offset order, and the
    hand-off points right after what was published."""
    k = data.draw(st.integers(1, 5), label="appends")
    ends = {}
    for p, (ts, _) in parts.items():  # every partition present from the first compaction on
        ends[p] = sorted(data.draw(st.lists(st.integers(1, len(ts)), min_size=k, max_size=k), label=f"ends {p}"))
    whole = plan_slices(stats_for(parts, duration), duration, seal_all=True)
    after, slice_of, made_late, first_slices = None, {}, 0, []
    for step in range(k + 1):
        last = step == k
        hi = {p: len(ts) if last else ends[p][step] for p, (ts, _) in parts.items()}
        lo = {p: (after.handoff[p] - 1000 * p if after else 0) for p in parts}
        lo = {p: min(lo[p], hi[p]) for p in parts}
        chunks = stats_between(parts, lo, hi, duration)
        try:
            plan = plan_slices(chunks, duration, seal_all=last, idle_after_ms=idle, after=after)
        except NothingSealed:
            continue
        first_slices.append(plan.first)
        assert plan.first == (after.slices if after else 0) and plan.slices > plan.first
        for s, ranges in plan.ranges.items():
            assert plan.first <= s < plan.slices
            for r in ranges:
                for o in range(r.first_offset, r.last_offset + 1):
                    assert o not in slice_of  # published once
                    slice_of[o] = s
        made_late += plan.made_late
        for p in parts:  # published records are a prefix of each partition; the hand-off follows it
            assert plan.handoff[p] == 1000 * p + sum(1 for o in slice_of if o // 1000 == p)
        after = Continuation(plan.base, plan.slices, plan.handoff, plan.running_max)
        if idle is None:
            for s in range(plan.first, plan.slices):
                assert plan.ranges.get(s, []) == whole.ranges.get(s, [])
    if after is None:
        return
    late = 0
    for p, (ts, _) in parts.items():
        own = np.maximum.accumulate(ts) // duration - whole.base
        got = [slice_of.get(1000 * p + i) for i in range(len(ts))]
        assert None not in got  # the last append sealed everything: all published
        assert all(a <= b for a, b in zip(got, got[1:]))  # offset order: slices never go back
        for i, s in enumerate(got):
            assert s >= own[i]
            if s > own[i]:
                late += 1
                assert s in first_slices  # lifted into the first slice of its append
    assert late == made_late
    if idle is None:
        assert made_late == 0


def test_overlap_and_gaps_are_named():
    ts = np.arange(10, dtype=np.int64)
    a = ChunkStats("a.avro", "t", 0, 0, 4, 5, 0, 4, chunk_stretches(np.arange(5), ts[:5], 3))
    b = ChunkStats("b.avro", "t", 0, 4, 8, 5, 5, 9, chunk_stretches(np.arange(4, 9), ts[5:], 3))
    with pytest.raises(SlicingError, match="b.avro.*overlap.*a.avro"):
        plan_slices([a, b], 3, seal_all=True)
    c = ChunkStats("c.avro", "t", 0, 7, 11, 5, 5, 9, chunk_stretches(np.arange(7, 12), ts[5:], 3))
    with pytest.raises(SlicingError, match="5..6 missing.*--allow-gaps"):
        plan_slices([a, c], 3, seal_all=True)
    assert plan_slices([a, c], 3, allow_gaps=True, seal_all=True).gaps


@pytest.mark.parametrize(
    "text, ms",
    [
        ("500ms", 500),
        ("90s", 90_000),
        ("10m", 600_000),
        ("10min", 600_000),
        ("1h", 3_600_000),
        ("2d", 172_800_000),
        ("10 minutes", 600_000),  # Spark's interval words, as withWatermark takes them
        ("1 Hour", 3_600_000),
        ("30 seconds", 30_000),
    ],
)
def test_parse_duration(text, ms):
    assert parse_duration(text) == ms


@pytest.mark.parametrize("bad", ["0s", "10", "ten minutes", "-5m", "1w", "10 minuts"])
def test_bad_duration_names_the_option(bad):
    with pytest.raises(ValueError, match="--slice-duration"):
        parse_duration(bad)
