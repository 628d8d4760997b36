"""Phase 1 of the compaction: bytes and records per key, and per chunk the summaries slicing
needs, computed in Spark tasks; the driver receives per-key totals, never records.

Two stages. A map task per batch of chunks sums its records by key, like a combiner
(`_map_task`), and ships the sums in a few Arrow IPC blobs, one per reducer: a reducer owns
the keys whose hash is r mod R (null keys: their partition mod R), so it owns whole hash
buckets too. A reducer sums its keys across chunks and returns what the driver asked for:
every key while they are few, else the heavy keys and its share of the buckets. Spark moves
a few large binary rows instead of a row per key: with as many keys as records, a row per
key cost the JVM more than the rest of the pass together (measured with
`bench/bench_scale.py`: docs/performance.md#key-sums-as-blobs-through-the-statistics-shuffle).
Every sum goes through the key's hash, computed once per record and carried with the sums
(`compactor.key_sums`)"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from enum import IntEnum
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from compactor.chunks import chunk_rows, read_checked
from compactor.execution import Execution, Rows, Task
from compactor.history import batch_digests
from compactor.key_sums import by_key, from_blobs, record_sums, to_blob
from compactor.slicing import ChunkStats, Stretch, chunk_stretches
from compactor.sources import SourceArchive, SourceChunk
from keygroups import envelope
from keygroups.assignment import BUCKETS_PER_GROUP


class Mapped(IntEnum):
    """What a row of a map task holds (its `output`; an int: rows are many, names repeated)."""

    SUMS = 0  # a blob of key sums (SUMS_SCHEMA) for the reducer its `slot` reaches
    CHUNK_SUMMARY = 1  # a chunk's payload (`bytes`) and its ChunkStats (`chunk`)
    DISTINCT_KEYS = 2  # the distinct keys of the records summed at once (`records`): at least as many in all


_MAP_ARROW = pa.schema(
    [("output", pa.int32()), ("slot", pa.int64()), ("blob", pa.binary()), ("bytes", pa.int64()),
     ("records", pa.int64()), ("chunk", pa.string())]
)  # fmt: skip


class Reduced(IntEnum):
    """What a row of a reducer holds."""

    KEY_TOTALS = 0  # a key's totals
    BUCKET_TOTALS = 2  # a bucket's
    DISTINCT_KEYS = 3  # the reducer's distinct keys (`keys`): the driver learns the count where the keys stay behind


_REDUCED_ARROW = pa.schema(
    [("output", pa.int32()), ("key", pa.binary()), ("null_part", pa.int32()), ("bucket", pa.int32()),
     ("bytes", pa.int64()), ("records", pa.int64()), ("keys", pa.int64())]
)  # fmt: skip
_BUCKETS_ARROW = pa.schema(
    [("bucket", pa.int32()), ("bytes", pa.int64()), ("records", pa.int64()), ("keys", pa.int64())]
)
# A row of _MAP_ARROW: output, slot, blob, bytes, records, chunk.
_MapRow = tuple[Mapped, int | None, bytes | None, int | None, int | None, str | None]
MAX_REDUCERS = BUCKETS_PER_GROUP  # a power of two, at most the fewest buckets: a bucket belongs to one reducer
REDUCER_ROWS = 2_000_000  # key sums a reducer should hold at most (~100 MB), where MAX_REDUCERS allows


@dataclass(frozen=True)
class KeySplit:
    """Which keys the driver receives one by one. `buckets` None: every key, while there are
    no more than `limit` (None: however many). Else the null-key pseudo-keys, keys above
    `threshold` bytes (None: none by size) and the keys in `known` (an append's: the archive's
    exact entries) come one by one, and the rest as one row per bucket of their hash."""

    buckets: int | None = None
    threshold: int | None = None
    known: pa.Array | None = None
    limit: int | None = None


@dataclass
class Statistics:
    totals: pa.Table  # key, null_part, bytes, records: a row per key the split keeps exact (null keys: per partition)
    chunks: list[ChunkStats]
    keys: int = 0  # distinct keys, null-key pseudo-keys included
    payload: int = 0  # bytes of every record
    buckets: pa.Table | None = None  # bucket, bytes, records, keys: every bucket, in order; None: no buckets


Split = Callable[[int, int], KeySplit]  # (distinct keys, or fewer, payload bytes) -> the split


def reducers_for(parallelism: int, chunks: list[SourceChunk]) -> int:
    """R, a power of two: about twice the cores, more where the key sums would pass ~2M a
    reducer (sums are at most one per record; a chunk whose record count its listing does not
    give is taken as a record per 32 bytes), at most MAX_REDUCERS: never more than the fewest
    buckets (256, at one group), so a bucket (the hash's low bits) belongs to one reducer."""
    rows = sum(c.records if c.records is not None else c.size // 32 for c in chunks)
    want = max(2 * parallelism, -(-rows // REDUCER_ROWS))
    return min(MAX_REDUCERS, 1 << max(0, want - 1).bit_length())


FLUSH_ROWS = 1 << 20  # rows (a record's, or a key's sums) a map task holds before it sums them by key
UNSUMMED = 7  # flushes shipped unsummed after a sum that left most rows: then it sums again, to see


def _map_task(
    source: SourceArchive,
    chunks: list[SourceChunk],
    duration_ms: int,
    slots: npt.NDArray[np.int64],
    codec: str | None = None,
) -> Task:
    """A row per record, summed by key once FLUSH_ROWS have gathered, like a combiner:
    where the keys repeat the sums are held (and summed again with the next flush's
    records); where they are mostly distinct (more than half of FLUSH_ROWS) they are
    shipped, one blob per reducer. Where a sum leaves three rows in four (most keys new),
    the next UNSUMMED flushes ship their rows as they are, as Spark's partial aggregation
    does when it does not reduce: the reducer sums them all the same, and the map saves a
    pass that gains little. (Keys that turn out to repeat in those flushes cost the
    shuffle a row per record for a while, no more than `reducers_for` plans for.)"""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pending: list[pa.Table] = []
        held = 0
        unsummed = 0  # flushes to ship without summing
        last = 0  # the distinct keys the last sum found: about as many next time

        def sum_pending() -> Iterator[pa.RecordBatch]:
            nonlocal pending, held, unsummed, last
            rows = pa.concat_tables(pending)
            if unsummed:
                unsummed -= 1
                yield _ship_sums(by_key(rows, len(slots), sum_keys=False), slots, codec)
                pending, held = [], 0
                return
            sums = by_key(rows, len(slots), expect=last)
            last = sums.num_rows
            yield _map_rows(
                [(Mapped.DISTINCT_KEYS, None, None, None, sums.num_rows, None)]
            )  # distinct keys: at least these
            if sums.num_rows > 0.75 * rows.num_rows:
                unsummed = UNSUMMED
            if sums.num_rows > FLUSH_ROWS // 2:
                yield _ship_sums(sums, slots, codec)
                pending, held = [], 0
            else:
                pending, held = [sums], sums.num_rows

        for rows in batches:
            for row in rows.to_pylist():
                chunk = chunks[row["idx"]]
                batch = read_checked(source, chunk, row["from_offset"], encoded=source.reads_encoded)
                if not batch.num_rows:
                    continue  # straddles an append's hand-off: nothing new
                offsets = batch.column("offset").to_numpy()
                ts = batch.column("timestamp").cast(pa.int64()).to_numpy()
                weights = batch.column("bytes").to_numpy() if source.reads_encoded else envelope.record_bytes(batch)
                pending.append(record_sums(batch.column("key"), weights, chunk.partition))
                held += batch.num_rows
                stats = ChunkStats(
                    key=chunk.key,
                    topic=chunk.topic,
                    partition=chunk.partition,
                    first_offset=int(offsets[0]),
                    last_offset=int(offsets[-1]),
                    records=batch.num_rows,
                    min_timestamp=int(ts.min()),
                    max_timestamp=int(ts.max()),
                    stretches=chunk_stretches(offsets, ts, duration_ms, partial(batch_digests, batch)),
                )
                yield _map_rows(
                    [(Mapped.CHUNK_SUMMARY, None, None, int(weights.sum()), None, json.dumps(asdict(stats)))]
                )
                if held >= FLUSH_ROWS:
                    yield from sum_pending()
        if pending:
            yield from sum_pending()
            if pending:
                yield _ship_sums(pending[0], slots, codec)

    return task


def _ship_sums(sums: pa.Table, slots: npt.NDArray[np.int64], codec: str | None = None) -> pa.RecordBatch:
    """Key sums from `by_key(..., reducers=len(slots))`, in one blob per reducer (`to_blob`)."""
    if not sums.num_rows:
        return pa.RecordBatch.from_pylist([], _MAP_ARROW)
    null_part = sums.column("null_part").to_numpy()
    keyed = int(np.count_nonzero(null_part < 0))  # the keyed rows come first, in reducer order
    r_of = sums.column("hash").to_numpy()[:keyed].view(np.int64) % len(slots)
    keyed_in = np.bincount(r_of, minlength=len(slots))
    ends = np.cumsum(keyed_in)
    null_r = null_part[keyed:] % len(slots)
    blobs: list[_MapRow] = []
    for r in np.flatnonzero(keyed_in + np.bincount(null_r, minlength=len(slots))):
        a = int(ends[r - 1]) if r else 0
        share = [sums.slice(a, int(ends[r]) - a)]
        if (null_r == r).any():
            share.append(sums.slice(keyed).filter(pa.array(null_r == r)))
        blobs.append((Mapped.SUMS, int(slots[r]), to_blob(pa.concat_tables(share), codec), None, None, None))
    return _map_rows(blobs)


def _map_rows(rows: list[_MapRow]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(col, f.type) for col, f in zip(zip(*rows), _MAP_ARROW)], schema=_MAP_ARROW
    )


def _reduce(sums: pa.Table, how: KeySplit) -> pa.Table:
    """One reducer's keys, summed across chunks, as the driver asked: every key while there
    are at most `how.limit` (else only their count); with buckets, the keys that keep an
    entry one by one and the rest by bucket."""
    per_key = by_key(sums, expect=sums.num_rows // 4)  # keys repeat across map tasks, or few do
    n = per_key.num_rows
    count = _reduced_rows(Reduced.DISTINCT_KEYS, 1, keys=[n])
    key, null_part = per_key.column("key"), per_key.column("null_part").to_numpy()
    size, records = per_key.column("bytes").to_numpy(), per_key.column("records").to_numpy()
    if how.buckets is None:
        if how.limit is not None and n > how.limit:
            return count  # the driver switches to buckets: these keys are not needed
        return pa.concat_tables(
            [
                count,
                _reduced_rows(
                    Reduced.KEY_TOTALS, n, key=key.cast(pa.binary()), null_part=null_part, bytes=size, records=records
                ),
            ]
        )
    exact = null_part >= 0
    if how.threshold is not None:
        exact |= size > how.threshold
    if how.known is not None and len(how.known):
        exact |= pc.is_in(key, value_set=how.known).to_numpy(zero_copy_only=False)
    light = ~exact
    bucket = per_key.column("hash").to_numpy()[light].view(np.int64) & (how.buckets - 1)
    keys_in = np.bincount(bucket, minlength=how.buckets)
    at = np.flatnonzero(keys_in)  # this reducer's buckets (hash mod R) that hold a key
    in_bucket = {
        name: np.bincount(bucket, weights=v[light], minlength=how.buckets)[at].astype(np.int64)
        for name, v in (("bytes", size), ("records", records))
    }
    return pa.concat_tables(
        [
            count,
            _reduced_rows(
                Reduced.KEY_TOTALS,
                int(exact.sum()),
                key=key.filter(pa.array(exact)).cast(pa.binary()),
                null_part=null_part[exact],
                bytes=size[exact],
                records=records[exact],
            ),
            _reduced_rows(Reduced.BUCKET_TOTALS, len(at), bucket=at, keys=keys_in[at], **in_bucket),
        ]
    )


def _reduced_rows(output: Reduced, n: int, **columns: pa.Array | npt.NDArray[Any] | list[int]) -> pa.Table:
    """n rows of _REDUCED_ARROW of one output: the columns given (Arrow arrays as they are,
    numpy ones converted), nulls in the others."""

    def column(f: pa.Field) -> pa.Array:
        if f.name == "output":
            return pa.repeat(int(output), n).cast(f.type)
        value = columns.get(f.name)
        if value is None:
            return pa.nulls(n, f.type)
        return value if isinstance(value, pa.Array | pa.ChunkedArray) else pa.array(value, f.type)

    return pa.table([column(f) for f in _REDUCED_ARROW], schema=_REDUCED_ARROW)


def _reduce_task(how: KeySplit, codec: str | None = None) -> Task:
    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        blobs = [b for batch in batches for b in batch.column("blob").to_pylist()]
        if blobs:  # a reducer that received nothing has no keys to report
            yield from _reduce(from_blobs(blobs, codec), how).to_batches()

    return task


def statistics_pass(
    execution: Execution[Rows],
    source: SourceArchive,
    chunks: list[SourceChunk],
    duration_ms: int,
    handoff: dict[int, int] | None = None,
    split: Split = lambda keys, payload: KeySplit(),
) -> Statistics:
    """`handoff`: for an append, each partition's first offset to count (the archive holds the
    rest); `split`: given the distinct keys (or a lower bound) and the payload, which keys
    come one by one."""
    slots = execution.slots(reducers_for(execution.parallelism, chunks))
    task = _map_task(source, chunks, duration_ms, slots, execution.codec)
    with execution.persist(execution.map(chunk_rows(chunks, handoff=handoff), task, _MAP_ARROW)) as mapped:
        summaries = execution.collect(
            "chunk summaries",
            execution.where(
                mapped, "output", [Mapped.CHUNK_SUMMARY, Mapped.DISTINCT_KEYS], ["chunk", "bytes", "records"]
            ),
        )
        blobs = execution.where(mapped, "output", [Mapped.SUMS], ["slot", "blob"])

        def reduce(how: KeySplit) -> pa.Table:
            return execution.shuffle(
                "key totals", blobs, len(slots), _reduce_task(how, execution.codec), _REDUCED_ARROW
            )

        return _settle(summaries, reduce, split)


def _settle(summaries: pa.Table, reduce: Callable[[KeySplit], pa.Table], split: Split) -> Statistics:
    """Ask the reducers for every key while the split allows it, else for heavy keys and
    buckets. The map's summaries give the payload and a lower bound on the distinct keys (the
    most summed at once), which most often settles exact against bucketed at once."""
    payload = int(pc.sum(summaries.column("bytes")).as_py() or 0)
    at_least = int(pc.max(summaries.column("records")).as_py() or 0)
    how = split(at_least, payload)
    while True:
        rows = reduce(how)
        output = rows.column("output").to_numpy()
        keys = int(rows.column("keys").to_numpy(zero_copy_only=False)[output == Reduced.DISTINCT_KEYS].sum())
        if how.buckets is None and how.limit is not None and keys > how.limit:
            how = split(keys, payload)  # more keys than any map task summed at once
            continue
        totals = rows.filter(pa.array(output == Reduced.KEY_TOTALS)).select(["key", "null_part", "bytes", "records"])
        buckets = None
        if how.buckets is not None:
            buckets = _every_bucket(
                rows.filter(pa.array(output == Reduced.BUCKET_TOTALS)).select(["bucket", "bytes", "records", "keys"]),
                how.buckets,
            )
        chunk_rows = [c for c in summaries.column("chunk").to_pylist() if c is not None]
        return Statistics(totals, _chunk_stats(chunk_rows), keys, payload, buckets)


def _every_bucket(sums: pa.Table, buckets: int) -> pa.Table:
    """One row per bucket, in bucket order, empty buckets with zeros: the assignment lists
    every bucket, so a key never met still has a group."""
    out = {name: np.zeros(buckets, np.int64) for name in ("bytes", "records", "keys")}
    at = sums.column("bucket").to_numpy()
    for name in out:
        np.add.at(out[name], at, sums.column(name).to_numpy())  # a bucket comes from one reducer; summed all the same
    return pa.table({"bucket": pa.array(np.arange(buckets, dtype=np.int32)), **out}, schema=_BUCKETS_ARROW)


def _chunk_stats(rows: list[str]) -> list[ChunkStats]:
    out = []
    for row in rows:
        d = json.loads(row)
        d["stretches"] = [Stretch(**r) for r in d["stretches"]]
        out.append(ChunkStats(**d))
    return out
