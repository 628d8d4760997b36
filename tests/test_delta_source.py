"""`--format delta`: a bronze table (the Kafka source's columns, written by delta-rs) read as
the topic it holds: every record once, each partition in offset order, whatever files the
writers and OPTIMIZE left; the version pinned; what cannot be read refused by name."""

from __future__ import annotations

import datetime as dt
import random

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.errors import ArchiveError
from compactor.job import CompactConfig, compact
from compactor.sources import open_source
from compactor.sources.delta import DeltaSource
from compactor.sources.delta.table import delta_location, storage_options
from compactor.verify import verify
from keygroups.envelope import CorruptFile
from keygroups.storage import open_storage

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def bronze(records: list[tuple[int, int]], topic: str = "payments") -> pa.Table:
    """Rows as Spark's Kafka source gives them (and a bronze job's ingestion date), for
    (partition, offset) pairs; an offset's second is its event time."""
    return pa.table(
        {
            "key": pa.array([b"k%d" % ((p * 7 + o) % 13) for p, o in records]),
            "value": pa.array([b"v%d-%d" % (p, o) for p, o in records]),
            "topic": pa.array([topic] * len(records)),
            "partition": pa.array([p for p, _ in records], pa.int32()),
            "offset": pa.array([o for _, o in records], pa.int64()),
            "timestamp": pa.array([T0 + dt.timedelta(seconds=o) for _, o in records], pa.timestamp("us", tz="UTC")),
            "timestampType": pa.array([0] * len(records), pa.int32()),
            "headers": pa.array([[{"key": "p", "value": b"%d" % p}] for p, _ in records], HEADERS),
            "date": pa.array([(T0 + dt.timedelta(hours=o // 100)).date().isoformat() for _, o in records]),
        }
    )


def write(url: str, table: pa.Table, mode: str = "append") -> None:
    loc = delta_location(url)
    write_deltalake(loc, table, mode=mode, partition_by=["date"], storage_options=storage_options(loc))


def copy_table(folder: str, url: str) -> None:
    """The table's log and data files, those not there yet, to `url` on any store."""
    here, there = open_storage(folder), open_storage(url)
    have = {o.key for o in there.list()}
    for o in here.list():
        if o.key not in have:
            there.write(o.key, here.read(o.key))


def topic(partitions: int, per_partition: int) -> list[tuple[int, int]]:
    """(partition, offset) pairs with gaps, as a transactional topic's markers leave them."""
    return [(p, o) for p in range(partitions) for o in range(0, per_partition * 2, 2)]


def read_all(source: DeltaSource) -> list[tuple[int, int, bytes, int]]:
    out = []
    for chunk in source.list_chunks():
        batch = source.read(chunk)
        offsets = batch.column("offset").to_pylist()
        assert offsets == sorted(offsets) and set(batch.column("partition").to_pylist()) <= {chunk.partition}
        out += zip(
            batch.column("partition").to_pylist(),
            offsets,
            batch.column("value").to_pylist(),
            [len(h) for h in batch.column("headers").to_pylist()],
        )
    return out


def test_a_bronze_table_compacts_appends_and_verifies_on_every_store(any_store_url, tmp_path):
    """Two commits, an OPTIMIZE, a compaction, two more commits out of order, an append: the
    archive holds each record once, each key's records in offset order. The table is written
    by delta-rs on local disk and copied to the store after each commit (fake-gcs-server
    refuses delta-rs's uploads; the real stores take them)."""
    lake = str(tmp_path / "lake")
    url = f"{any_store_url}/bronze/payments"

    def commit(rows: list[tuple[int, int]], mode: str = "append") -> None:
        write(lake, bronze(rows), mode=mode)
        copy_table(lake, url)

    records = topic(3, 400)
    first, later = records[:600] + records[800:1000], records[600:800] + records[1000:]
    commit(first[:500], mode="error")
    commit(first[500:])
    DeltaTable(lake).optimize.compact()  # rewrites files, dataChange=false
    copy_table(lake, url)
    dest = str(tmp_path / "c")
    r = compact(CompactConfig(source=url, dest=dest, source_format="delta", groups=3, slice_duration="1m"))
    assert 0 < r.records <= len(first)
    random.Random(3).shuffle(later)
    commit(later[::2])
    commit(later[1::2])
    r = compact(CompactConfig(source=url, dest=dest, source_format="delta", append=True, seal_all=True))
    assert r.kind == "append" and r.records == len(records)
    report = verify(open_source(url, format="delta"), open_storage(dest))
    assert report.ok, report.violations
    import reader

    seen: dict[bytes | None, list[tuple[int, int]]] = {}
    with reader.replay(dest, threads=3) as events:
        for ev in events:
            if isinstance(ev, reader.Records):
                for k, p, o in zip(*(ev.batch.column(c).to_pylist() for c in ("key", "partition", "offset"))):
                    seen.setdefault(k, []).append((p, o))
    assert sorted(x for v in seen.values() for x in v) == sorted(records)  # every record once
    for v in seen.values():  # each key's records of a partition in offset order
        assert all(offsets == sorted(offsets) for offsets in ([o for p, o in v if p == q] for q in range(3)))


@settings(max_examples=40, deadline=None)
@given(
    partitions=st.integers(1, 4),
    per_partition=st.integers(1, 60),
    commits=st.integers(1, 5),
    optimize=st.booleans(),
    chunk_records=st.integers(5, 200),
    seed=st.integers(0, 2**16),
)
def test_any_split_of_the_rows_into_files_reads_as_the_topic(
    tmp_path_factory, partitions, per_partition, commits, optimize, chunk_records, seed
):
    """Invariant: whatever files the rows landed in, in whatever order, and however the
    chunks cut the offsets, each record is read once, each partition in offset order."""
    records = topic(partitions, per_partition)
    shuffled = records[:]
    random.Random(seed).shuffle(shuffled)
    url = str(tmp_path_factory.mktemp("delta") / "t")
    for i in range(commits):
        if shuffled[i::commits]:
            write(url, bronze(shuffled[i::commits]))
    if optimize:
        DeltaTable(url).optimize.compact()
    source = DeltaSource(url)
    source.chunk_records = chunk_records
    got = read_all(source)
    assert sorted((p, o) for p, o, _, _ in got) == sorted(records) and len(got) == len(records)
    assert all(v == b"v%d-%d" % (p, o) and h == 1 for p, o, v, h in got)


def test_the_version_is_pinned_and_an_older_one_can_be_named(tmp_path):
    url = str(tmp_path / "t")
    write(url, bronze(topic(2, 10)), mode="error")
    source = DeltaSource(url)
    write(url, bronze([(0, 100), (1, 100)]))
    assert len(read_all(source)) == 20  # the version opened, not the one committed since
    assert len(read_all(DeltaSource(url))) == 22
    assert len(read_all(open_source(url, format="delta", options={"table_version": 0}))) == 20
    assert DeltaSource(url).topic == "payments"  # from the topic column, not the folder


def test_what_cannot_be_read_is_refused_by_name(tmp_path):
    no_offset = str(tmp_path / "no_offset")
    write_deltalake(no_offset, bronze(topic(1, 3)).drop_columns(["offset"]))
    with pytest.raises(
        ArchiveError,
        match=r"no_offset \(version 0\): offset is column 'offset' in the 'kafka' layout, which the table lacks",
    ):
        DeltaSource(no_offset)
    two = str(tmp_path / "two")
    write(two, bronze(topic(1, 3), topic="a"))
    write(two, bronze(topic(1, 3), topic="b"))
    with pytest.raises(ArchiveError, match=r"several topics \(a, b\)"):
        DeltaSource(two).list_chunks()
    dup = str(tmp_path / "dup")
    write(dup, bronze(topic(1, 3)))
    write(dup, bronze([(0, 2)]))
    source = DeltaSource(dup)
    with pytest.raises(CorruptFile, match=r"partition 0 offset 2 appears more than once"):
        read_all(source)
    with pytest.raises(ArchiveError, match=r"nowhere: cannot read the Delta table"):
        DeltaSource(str(tmp_path / "nowhere"))


def test_rows_deleted_below_the_hand_off_stay_in_the_archive(tmp_path):
    """A GDPR delete rewrites files without the rows: an append reads on from the hand-off
    and the archive keeps what it already holds (it is immutable: re-compact to drop them);
    verify reports each record the table no longer has."""
    url = str(tmp_path / "t")
    records = topic(2, 300)
    write(url, bronze(records[:200] + records[300:500]), mode="error")
    dest = str(tmp_path / "c")
    compact(CompactConfig(source=url, dest=dest, source_format="delta", groups=2, slice_duration="1m"))
    DeltaTable(url).delete("offset < 20")  # copy-on-write: no deletion vectors
    write(url, bronze(records[200:300] + records[500:]))
    r = compact(CompactConfig(source=url, dest=dest, source_format="delta", append=True, seal_all=True))
    assert r.records == len(records)  # the 20 deleted rows are still in the archive
    report = verify(open_source(url, format="delta"), open_storage(dest))
    assert report.counts["exactly_once"] == 20  # one violation a deleted record, and nothing else
    assert sum(report.counts.values()) == 20
