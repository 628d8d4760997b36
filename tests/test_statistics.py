"""The statistics pass's reduce (compactor.statistics): key sums of many chunks, split over R
reducers by key hash, settled into per-key totals or heavy keys and buckets, equal a plain
reference computed from the records, whatever R and however the chunks cut the records."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor import statistics
from compactor.statistics import _SUMS_ARROW, KeySplit, _reduce, _settle
from keygroups.key_hash import hash_keys

record_st = st.tuples(st.one_of(st.none(), st.binary(max_size=3)), st.integers(0, 2), st.integers(1, 50))


def _hash(key: bytes) -> int:
    return int(hash_keys(pa.array([key], pa.binary())).view(np.int64)[0])


def _chunk_sums(records) -> pa.Table:
    """What a map task computes for one chunk: sums by key (null keys by partition)."""
    sums: dict = defaultdict(lambda: [0, 0])
    for key, part, size in records:
        entry = sums[(key, part if key is None else -1)]
        entry[0] += size
        entry[1] += 1
    rows = [{"key": k, "null_part": p, "bytes": b, "records": r} for (k, p), (b, r) in sums.items()]
    return pa.Table.from_pylist(rows, schema=_SUMS_ARROW)


@settings(max_examples=500, deadline=None)
@given(
    chunks=st.lists(st.lists(record_st, min_size=1, max_size=15), min_size=1, max_size=6),
    reducers=st.sampled_from([1, 2, 4]),
    mode=st.sampled_from(["exact", "limited", "buckets"]),
    limit=st.integers(0, 12),
    buckets=st.sampled_from([4, 8]),
    threshold=st.one_of(st.none(), st.integers(0, 80)),
    known=st.sets(st.binary(max_size=3), max_size=3),
)
def test_settled_totals_match_the_records(chunks, reducers, mode, limit, buckets, threshold, known):
    per_chunk = [_chunk_sums(c) for c in chunks]
    # the map side: each chunk's sums to the reducer of hash mod R (null keys: partition mod R)
    share: list[list[pa.Table]] = [[] for _ in range(reducers)]
    for sums in per_chunk:
        keys = sums.column("key")
        nulls = keys.is_null().to_numpy(zero_copy_only=False)
        part = np.where(nulls, sums.column("null_part").to_numpy(), hash_keys(keys).view(np.int64)) % reducers
        for r in range(reducers):
            share[r].append(sums.filter(pa.array(part == r)))
    summaries = pa.table(
        {
            "chunk": ["{}"] * len(chunks),
            "bytes": [sum(s for _, _, s in c) for c in chunks],
            "records": [t.num_rows for t in per_chunk],
        }
    )

    def reduce(how: KeySplit) -> pa.Table:
        return pa.concat_tables(_reduce(pa.concat_tables(share[r]), how) for r in range(reducers))

    bucketed = KeySplit(buckets=buckets, threshold=threshold, known=pa.array(sorted(known), pa.binary()))
    asked = []

    def split(keys: int, payload: int) -> KeySplit:
        asked.append(keys)
        if mode == "exact":
            return KeySplit()
        if mode == "limited" and keys <= limit:
            return KeySplit(limit=limit)
        return bucketed

    real_chunk_stats = statistics._chunk_stats
    statistics._chunk_stats = lambda rows: []  # the summaries here carry no ChunkStats
    try:
        got = _settle(summaries, reduce, split)
    finally:
        statistics._chunk_stats = real_chunk_stats

    # the reference, from the records
    totals: dict = defaultdict(lambda: [0, 0])
    for c in chunks:
        for key, part, size in c:
            entry = totals[(key, part if key is None else -1)]
            entry[0] += size
            entry[1] += 1
    assert got.keys == len(totals)
    assert got.payload == sum(s for c in chunks for _, _, s in c)
    rows = {(r["key"], r["null_part"]): [r["bytes"], r["records"]] for r in got.totals.to_pylist()}
    if got.buckets is None:
        assert mode == "exact" or len(totals) <= limit
        assert rows == dict(totals)
        return
    assert mode == "buckets" or len(totals) > limit
    assert asked[0] == max(t.num_rows for t in per_chunk)  # the first split sees the most keys in a chunk

    def exact(key, null_part, size) -> bool:
        return null_part >= 0 or (threshold is not None and size > threshold) or key in known

    assert rows == {k: v for k, v in totals.items() if exact(k[0], k[1], v[0])}
    want = np.zeros((buckets, 3), np.int64)
    for (key, null_part), (size, records) in totals.items():
        if not exact(key, null_part, size):
            want[_hash(key) & (buckets - 1)] += (size, records, 1)
    have = got.buckets
    assert have.column("bucket").to_pylist() == list(range(buckets))
    assert np.array_equal(np.stack([have.column(c).to_numpy() for c in ("bytes", "records", "keys")], 1), want)
