"""The statistics pass's reduce (compactor.statistics): key sums of many chunks, split over R
reducers by key hash, settled into per-key totals or heavy keys and buckets, equal a plain
reference computed from the records, whatever R and however the chunks cut the records."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactor import statistics
from compactor.execution import InProcess
from compactor.key_sums import SUMS_SCHEMA, by_key, from_blobs, sum_by_key
from compactor.shuffle_codec import CODEC
from compactor.sources import open_source
from compactor.sources.envelope import write_chunk
from compactor.statistics import KeySplit, _reduce, _settle
from keygroups.key_hash import hash_keys
from keygroups.storage import open_storage
from tests.records import envelope_records

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
    rows = [
        {"key": k, "hash": 0 if k is None else _hash(k) % 2**64, "null_part": p, "bytes": b, "records": r}
        for (k, p), (b, r) in sums.items()
    ]
    return pa.Table.from_pylist(rows, schema=SUMS_SCHEMA)


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


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.one_of(st.none(), st.binary(max_size=4)), st.integers(0, 2), st.integers(0, 9)), max_size=60
    ),
    hash_bits=st.sampled_from([0, 1, 2, 64]),
    large=st.booleans(),
    reducers=st.sampled_from([1, 2, 4]),
    codec=st.sampled_from([None, CODEC]),
)
def test_sums_by_key_keep_keys_that_share_a_hash_apart(rows, hash_bits, large, reducers, codec):
    """Summing through the hash merges rows only where the key bytes are equal: with the
    hash cut to a few bits, many distinct keys share one and must still come out apart."""
    keys = pa.array([k for k, _, _ in rows], pa.large_binary() if large else pa.binary())
    hashes = hash_keys(keys)
    if hash_bits < 64:
        hashes &= np.uint64((1 << hash_bits) - 1)
    size = np.array([s for _, _, s in rows], np.int64)
    records = np.arange(len(rows), dtype=np.int64) % 3 + 1
    first, got_size, got_records = sum_by_key(keys, hashes, size, records)
    want: dict = {}
    for (key, _, s), r in zip(rows, records.tolist()):
        if key is not None:
            entry = want.setdefault(key, [0, 0])
            entry[0] += s
            entry[1] += r
    assert [keys[i].as_py() for i in first] == list(want)  # each key once, in the order keys first appear
    assert [[a, b] for a, b in zip(got_size.tolist(), got_records.tolist())] == list(want.values())

    # the whole step: null keys summed by their partition, every sum kept with its hash
    null_part = np.array([p if k is None else -1 for k, p, _ in rows], np.int32)
    table = pa.table([keys.cast(pa.large_binary()), hashes, null_part, size, records], schema=SUMS_SCHEMA)
    summed = by_key(table, reducers)
    keyed = summed.filter(pa.compute.is_valid(summed.column("key")))
    r_of = (keyed.column("hash").to_numpy().view(np.int64) % reducers).tolist()
    assert r_of == sorted(r_of)  # by reducer, as the map ships them
    slots = np.arange(100, 100 + reducers)
    shipped = statistics._ship_sums(summed, slots, codec).to_pylist()  # compressed or not, as on Spark or here
    for row in shipped:  # each blob holds its reducer's rows only
        share = from_blobs([row["blob"]], codec)
        r = int(row["slot"]) - 100
        part = np.where(share.column("null_part").to_numpy() >= 0, share.column("null_part").to_numpy(), 0)
        keyed_r = share.column("hash").to_numpy().view(np.int64) % reducers
        assert (
            np.where(share.column("key").is_null().to_numpy(zero_copy_only=False), part % reducers, keyed_r) == r
        ).all()
    assert sorted(map(str, from_blobs([row["blob"] for row in shipped], codec).to_pylist())) == sorted(
        map(str, summed.to_pylist())
    )
    nulls: dict = defaultdict(lambda: [0, 0])
    for (key, part, s), r in zip(rows, records.tolist()):
        if key is None:
            nulls[part][0] += s
            nulls[part][1] += r
    got = {(r["key"], r["null_part"]): [r["bytes"], r["records"], r["hash"]] for r in summed.to_pylist()}
    expect = {(k, -1): [*v, int(hashes[first[i]])] for i, (k, v) in enumerate(want.items())}
    expect |= {(None, p): [*v, 0] for p, v in nulls.items()}
    assert got == expect


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chunks=st.lists(
        st.tuples(
            st.integers(0, 2),
            # few keys that repeat, and keys that are mostly new (the map then ships rows unsummed)
            st.lists(
                st.one_of(st.none(), st.sampled_from([b"a", b"bb", b"c"]), st.binary(min_size=4, max_size=5)),
                min_size=1,
            ),
        ),
        min_size=1,
        max_size=8,
    ),
    flush=st.integers(1, 30),
)
def test_the_map_side_sums_records_whatever_it_holds(tmp_path_factory, chunks, flush):
    """A map task sums its records by key once FLUSH_ROWS gather, holds the sums while the
    keys repeat, ships them once they are mostly distinct, and ships rows unsummed for a
    while after a sum that left nearly every row; whatever the flush size, the totals are
    each key's records and bytes, and the distinct-key bound never passes the truth."""
    src = open_storage(str(tmp_path_factory.mktemp("s")))
    next_offset = defaultdict(int)
    want: dict = defaultdict(lambda: [0, 0])
    for p, keys in chunks:
        offsets = list(range(next_offset[p], next_offset[p] + len(keys)))
        next_offset[p] += len(keys)
        batch = envelope_records(p, offsets, [1000 * o for o in offsets], keys)
        write_chunk(src, batch, "t", codec="null")
        for k, o in zip(keys, offsets):
            entry = want[(k, p if k is None else -1)]
            entry[0] += len(k or b"") + len(b"v%d" % o)
            entry[1] += 1
    source = open_source(src.url)
    bounds = []
    split = statistics._settle
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(statistics, "FLUSH_ROWS", flush)
        mp.setattr(
            statistics,
            "_settle",
            lambda summaries, *a: bounds.append(summaries.column("records")) or split(summaries, *a),
        )
        got = statistics.statistics_pass(InProcess(), source, source.list_chunks(), 60_000)
    assert {(r["key"], r["null_part"]): [r["bytes"], r["records"]] for r in got.totals.to_pylist()} == dict(want)
    assert got.keys == len(want) and len(got.chunks) == len(source.list_chunks())
    assert 0 < pa.compute.max(bounds[0]).as_py() <= len(want)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    keys=st.integers(600, 5000),
    hash_bits=st.sampled_from([3, 12, 64]),
    expect=st.sampled_from([0, 100, 10_000]),
)
def test_sums_by_key_hold_through_the_table_growing(seed, keys, hash_bits, expect):
    """Past 512 distinct keys the table doubles, placing every entry again; with hashes cut
    to a few bits (many keys share one) or left whole (high bits set), and whatever size
    the caller expected, each key still has its own sums."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, keys, 3 * keys)
    column = pa.array([b"key-%d" % i for i in ids.tolist()], pa.large_binary())
    hashes = hash_keys(column)
    if hash_bits < 64:
        hashes = (hashes & np.uint64((1 << hash_bits) - 1)) | np.uint64(1 << 63)  # the high bit set as well
    size = rng.integers(0, 100, len(ids))
    first, got_size, got_records = sum_by_key(column, hashes, size, np.ones(len(ids), np.int64), expect)
    order = list(dict.fromkeys(ids.tolist()))
    assert ids[first].tolist() == order
    assert got_size.tolist() == [int(size[ids == k].sum()) for k in order]
    assert got_records.tolist() == [int((ids == k).sum()) for k in order]
