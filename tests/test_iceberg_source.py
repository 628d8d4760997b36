"""`--format iceberg`: Kafka topics materialised as Iceberg tables with Redpanda Iceberg
Topics' schema, written by an independent writer (pyiceberg, into an embedded SQLite
catalog), rows shuffled across data files and partitions; read back in offset order,
compacted, verified and replayed exactly once; bad tables named."""

from __future__ import annotations

import glob
import json
import os
import random
import uuid

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.conversions import to_bytes
from pyiceberg.manifest import DATA_FILE_TYPE
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
    UUIDType,
)

from compactor.job import CompactConfig, compact
from compactor.sources import ArchiveError, open_source
from compactor.sources.iceberg import IcebergSource
from compactor.sources.iceberg import source as iceberg_source
from compactor.sources.offset_ranges import Extent, cut_ranges
from compactor.verify import verify
from keygroups.envelope import CorruptFile
from keygroups.storage import open_storage
from tests.records import decoded, redpanda_rows, redpanda_schema, replayed

T0_US = 1_767_225_600_000_000  # 2026-01-01, in microseconds


def catalog(root) -> SqlCatalog:
    os.makedirs(root, exist_ok=True)
    return SqlCatalog("default", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")


def topic_records(seed: int, partitions: int = 3, per_partition: int = 60, gaps: bool = True) -> dict[int, list]:
    """Per partition, Kafka-like records in offset order: offsets that skip (markers,
    aborted transactions), timestamps that mostly rise, null keys and tombstones, headers."""
    rng = random.Random(seed)
    out = {}
    for p in range(partitions):
        offset, ts, recs = rng.randrange(0, 50), T0_US + rng.randrange(0, 10**6), []
        for _ in range(per_partition):
            ts += rng.randrange(-2_000_000, 5_000_000)  # microseconds, a little out of order at times
            key = None if rng.random() < 0.05 else b"user%d" % rng.randrange(12)
            value = None if rng.random() < 0.05 else bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
            headers = [(f"h{i}", None if rng.random() < 0.2 else b"v%d" % i) for i in range(rng.randrange(3))]
            recs.append((offset, ts, key, value, headers))
            offset += 1 + (rng.randrange(1, 4) if gaps and rng.random() < 0.1 else 0)
        out[p] = recs
    return out


def write_table(root, records: dict[int, list], *, files: int = 4, seed: int = 0, name: str = "payments", schema=None):
    """The records shuffled over `files` appends (one data file each): every file holds rows
    of several partitions in no order, and a partition's offsets interleave across files."""
    cat = catalog(root)
    cat.create_namespace_if_not_exists("redpanda")
    table = cat.create_table(f"redpanda.{name}", schema or redpanda_schema())
    all_rows = redpanda_rows(records)
    random.Random(seed).shuffle(all_rows)
    arrow = table.schema().as_arrow()
    for i in range(files):
        part = all_rows[i::files]
        if part:
            table.append(pa.Table.from_pylist(part, schema=arrow))
    return cat.load_table(f"redpanda.{name}")


def expected(records: dict[int, list]) -> dict[int, list]:
    """What the envelope must hold: timestamps floored to ms, empty header lists."""
    return {
        p: [(o, ts // 1000, key, value, [(k, v) for k, v in h]) for o, ts, key, value, h in recs]
        for p, recs in records.items()
    }


def read_all(source) -> dict[int, list]:
    got: dict[int, list] = {}
    chunks = source.list_chunks()
    assert chunks == sorted(chunks, key=lambda c: (c.topic, c.partition, c.first_offset))
    for chunk in chunks:
        batch = source.read(chunk)
        assert all(p == chunk.partition for p in batch.column("partition").to_pylist())
        got.setdefault(chunk.partition, []).extend(decoded(batch))
    return got


def metadata_file(table) -> str:
    return table.metadata_location.removeprefix("file://")


# --- reading --------------------------------------------------------------------------


def test_shuffled_files_read_back_in_offset_order_each_record_once(tmp_path):
    records = topic_records(1)
    table = write_table(tmp_path, records, files=5)
    assert len(table.inspect.files()) == 5
    want = expected(records)
    by_file = IcebergSource(metadata_file(table))
    assert by_file.url == table.metadata.location.removeprefix("file://") and by_file.topic == "payments"
    assert read_all(by_file) == want
    by_catalog = open_source(f"sqlite:///{tmp_path}/catalog.db#redpanda.payments", format="iceberg")
    assert by_catalog.url == by_file.url and by_catalog.topic == "payments"
    assert read_all(by_catalog) == want
    folder = table.metadata.location.removeprefix("file://")
    with open(f"{folder}/metadata/version-hint.text", "w") as hint:  # what Hadoop-style catalogs keep beside
        hint.write(os.path.basename(metadata_file(table)))
    by_folder = IcebergSource(folder)
    assert by_folder.url == by_file.url and by_folder.metadata_location == metadata_file(table)
    assert read_all(by_folder) == want
    # Small chunks: each partition's offsets cut into several ranges over overlapping files.
    small = IcebergSource(metadata_file(table), chunk_records=7)
    assert len(small.list_chunks()) > 3 * 5
    assert read_all(small) == want


def test_files_without_statistics_are_measured_by_reading_two_columns(tmp_path, monkeypatch):
    """No manifest bounds and no Parquet statistics: the listing reads redpanda.partition and
    redpanda.offset of each file, and gets exact per-partition ranges (one chunk each here)."""
    records = topic_records(8)
    table = write_table(tmp_path, records, files=4)
    monkeypatch.setattr(IcebergSource, "_footer_extents", lambda self, index: None)
    source = IcebergSource(metadata_file(table))
    chunks = source.list_chunks()
    assert [(c.partition, c.first_offset) for c in chunks] == [(p, v[0][0]) for p, v in sorted(records.items())]
    assert read_all(source) == expected(records)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10**6),
    partitions=st.integers(1, 4),
    per_partition=st.integers(1, 40),
    files=st.integers(1, 5),
    chunk_records=st.integers(1, 50),
)
def test_any_shuffle_and_chunking_reads_the_topic_exactly(
    tmp_path_factory, seed, partitions, per_partition, files, chunk_records
):
    root = tmp_path_factory.mktemp("t")
    records = topic_records(seed, partitions, per_partition)
    table = write_table(root, records, files=files, seed=seed)
    assert read_all(IcebergSource(metadata_file(table), chunk_records=chunk_records)) == expected(records)


extent_st = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 200), st.integers(0, 60), st.integers(1, 40), st.integers(0, 9)),
    min_size=1,
    max_size=30,
)


@settings(max_examples=500, deadline=None)
@given(raw=extent_st, target=st.integers(1, 100))
def test_cut_ranges_cover_every_extent_with_disjoint_ranges_that_read_its_file(raw, target):
    """The chunk plan's invariant: per partition, ranges are disjoint and sorted, and every
    offset any data file may hold lies in exactly one range, which reads that file."""
    extents = [Extent(p, lo, lo + span, n, n * 10, f) for p, lo, span, n, f in raw]
    cut = cut_ranges(extents, target)
    for p in {e.partition for e in extents}:
        mine = [(lo, hi, files) for q, lo, hi, files, _ in cut if q == p]
        assert all(lo <= hi for lo, hi, _ in mine)
        assert all(a[1] < b[0] for a, b in zip(mine, mine[1:]))  # sorted, disjoint
        for e in (e for e in extents if e.partition == p):
            for o in range(e.lo, e.hi + 1):
                holding = [files for lo, hi, files in mine if lo <= o <= hi]
                assert len(holding) == 1 and e.file in holding[0]
    assert {q for q, *_ in cut} == {e.partition for e in extents}


def test_manifest_bounds_plan_without_reading_and_lying_bounds_are_named(tmp_path, monkeypatch):
    """Data files whose manifest entries carry redpanda.partition/offset bounds (as Java
    writers record them; pyiceberg's own writer keeps none for nested columns) are planned
    from the manifests alone; a file holding rows outside its bounds is refused."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    records = topic_records(2, partitions=2, per_partition=30)
    cat = catalog(tmp_path)
    cat.create_namespace("redpanda")
    table = cat.create_table("redpanda.payments", redpanda_schema())
    arrow = table.schema().as_arrow()
    pid = table.schema().find_field("redpanda.partition").field_id
    oid = table.schema().find_field("redpanda.offset").field_id
    lie = {}
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        for p, recs in records.items():
            for half in (recs[: len(recs) // 2], recs[len(recs) // 2 :]):
                part = redpanda_rows({p: half})
                random.Random(p).shuffle(part)
                (df,) = _dataframe_to_data_files(tx.table_metadata, pa.Table.from_pylist(part, schema=arrow), table.io)
                offsets = [o for o, *_ in half]
                hi = max(offsets) - (3 if p == 1 and not lie else 0)  # one file's bounds leave out its last offsets
                if hi != max(offsets):
                    lie[df.file_path] = hi
                # DataFile has no setters: its fields are positions of the manifest's struct
                fields = [f.name for f in DATA_FILE_TYPE[tx.table_metadata.format_version].fields]
                df[fields.index("lower_bounds")] = {
                    pid: to_bytes(IntegerType(), p),
                    oid: to_bytes(LongType(), min(offsets)),
                }
                df[fields.index("upper_bounds")] = {pid: to_bytes(IntegerType(), p), oid: to_bytes(LongType(), hi)}
                append.append_data_file(df)
    table = cat.load_table("redpanda.payments")
    source = IcebergSource(metadata_file(table))

    def no_reads(index):
        raise AssertionError("a file with manifest bounds was read at listing time")

    monkeypatch.setattr(source, "_measure", no_reads)
    chunks = source.list_chunks()
    assert {c.partition for c in chunks} == {0, 1}
    for chunk in (c for c in chunks if c.partition == 0):
        assert source.read(chunk).num_rows
    ((path, hi),) = lie.items()
    bad = [c for c in chunks if c.partition == 1 and c.first_offset <= hi]
    with pytest.raises(CorruptFile, match=rf"{path}: rows in partitions 1\.\.1, offsets .* outside the bounds"):
        for chunk in bad:
            source.read(chunk)


def test_timestamps_floor_to_ms_and_old_binary_header_keys_read_as_text(tmp_path):
    records = {0: [(0, T0_US + 999, b"k", b"v", [("trace", b"1")]), (1, T0_US + 1_000, None, None, [])]}
    table = write_table(tmp_path, records, files=1, schema=redpanda_schema(header_key=BinaryType))
    got = read_all(IcebergSource(metadata_file(table)))
    assert got == {0: [(0, T0_US // 1000, b"k", b"v", [("trace", b"1")]), (1, T0_US // 1000 + 1, None, None, [])]}


def test_value_schema_mode_values_are_json_of_the_parsed_columns(tmp_path):
    """Redpanda's value_schema_* modes put the value's fields beside `redpanda`: the value
    becomes their compact JSON (timestamps as integers in their own unit, bytes as base64)."""
    schema = redpanda_schema(value=False)
    schema = Schema(
        *schema.fields,
        NestedField(20, "user_id", IntegerType(), required=True),
        NestedField(21, "event_type", StringType(), required=False),
        NestedField(22, "at", TimestamptzType(), required=False),
        NestedField(23, "blob", BinaryType(), required=False),
    )
    cat = catalog(tmp_path)
    cat.create_namespace("redpanda")
    table = cat.create_table("redpanda.clicks", schema)
    base = redpanda_rows({0: [(5, T0_US, b"u", None, []), (4, T0_US, b"u", None, [])]})
    for r, (uid, kind) in zip(base, [(7, "click"), (8, None)]):
        del r["value"]
        r.update(user_id=uid, event_type=kind, at=T0_US + uid, blob=b"\x00\xff")
    table.append(pa.Table.from_pylist(base, schema=table.schema().as_arrow()))
    source = IcebergSource(metadata_file(table))
    (chunk,) = source.list_chunks()
    values = [json.loads(v) for v in source.read(chunk).column("value").to_pylist()]
    assert values == [
        {"user_id": 8, "event_type": None, "at": T0_US + 8, "blob": "AP8="},
        {"user_id": 7, "event_type": "click", "at": T0_US + 7, "blob": "AP8="},
    ]


def test_value_schema_mode_uuid_columns_are_their_text(tmp_path):
    """An Iceberg uuid column (pyiceberg reads it as arrow.uuid) becomes its canonical text,
    as the Parquet source writes it; nulls stay null."""
    schema = redpanda_schema(value=False)
    schema = Schema(
        *schema.fields,
        NestedField(20, "id", UUIDType(), required=False),
        NestedField(21, "n", IntegerType(), required=False),
    )
    cat = catalog(tmp_path)
    cat.create_namespace("redpanda")
    table = cat.create_table("redpanda.orders", schema)
    ids = [uuid.UUID("12345678-1234-5678-1234-567812345678"), None]
    base = redpanda_rows({0: [(0, T0_US, b"u", None, []), (1, T0_US, b"u", None, [])]})
    for i, (r, id_) in enumerate(zip(base, ids)):
        del r["value"]
        r.update(id=None if id_ is None else id_.bytes, n=i)
    table.append(pa.Table.from_pylist(base, schema=table.schema().as_arrow()))
    source = IcebergSource(metadata_file(table))
    (chunk,) = source.list_chunks()
    assert source.read(chunk).column("value").to_pylist() == [
        b'{"id":"12345678-1234-5678-1234-567812345678","n":0}',
        b'{"id":null,"n":1}',
    ]


# --- the whole path ---------------------------------------------------------------------


def test_a_redpanda_table_compacts_appends_verifies_and_replays_exactly_once(spark, tmp_path, monkeypatch):
    """Compact what the table holds, let the broker commit more data files, append from the
    hand-off offsets naming the newer metadata file (the same table): the archive holds the
    grown topic exactly once."""
    records = topic_records(3, partitions=3, per_partition=300)
    first = {p: v[:200] for p, v in records.items()}
    write_table(tmp_path / "lake", first, files=6)
    monkeypatch.setattr(iceberg_source, "DEFAULT_CHUNK_RECORDS", 90)  # several chunks per partition
    src = f"sqlite:///{tmp_path}/lake/catalog.db#redpanda.payments"
    assert len(open_source(src, format="iceberg").list_chunks()) >= 6
    dest = str(tmp_path / "c")
    r = compact(CompactConfig(source=src, dest=dest, source_format="iceberg", groups=3, slice_duration="20s"), spark)
    assert 0 < r.records <= sum(len(v) for v in first.values())
    table = catalog(tmp_path / "lake").load_table("redpanda.payments")
    later = redpanda_rows({p: v[200:] for p, v in records.items()})
    random.Random(9).shuffle(later)
    for i in range(2):
        table.append(pa.Table.from_pylist(later[i::2], schema=table.schema().as_arrow()))
    grown = metadata_file(catalog(tmp_path / "lake").load_table("redpanda.payments"))
    r = compact(
        CompactConfig(source=grown, dest=dest, source_format="iceberg", append=True, seal_all=True),
        spark,
    )
    assert r.kind == "append" and r.version == 2 and r.records == sum(len(v) for v in records.values())
    report = verify(open_source(src, format="iceberg"), open_storage(dest))
    assert report.ok, report.violations
    seen = replayed(dest)
    assert sorted(seen) == sorted((p, o) for p, v in records.items() for o, *_ in v)
    assert len(seen) == len(set(seen))


def test_a_table_on_s3_reads_with_the_standard_aws_settings(s3_server, s3_url, tmp_path):
    """Data and metadata on SeaweedFS; pyiceberg's FileIO finds the endpoint in AWS_ENDPOINT_URL."""
    records = topic_records(4, partitions=2, per_partition=40)
    cat = SqlCatalog(
        "default",
        uri=f"sqlite:///{tmp_path}/catalog.db",
        warehouse=s3_url,
        **{"s3.endpoint": s3_server.endpoint, "s3.region": "us-east-1"},
    )
    cat.create_namespace("redpanda")
    table = cat.create_table("redpanda.payments", redpanda_schema())
    all_rows = redpanda_rows(records)
    random.Random(4).shuffle(all_rows)
    for i in range(3):
        table.append(pa.Table.from_pylist(all_rows[i::3], schema=table.schema().as_arrow()))
    table = cat.load_table("redpanda.payments")
    assert table.metadata_location.startswith(s3_url)
    source = open_source(table.metadata_location.replace("s3://", "s3a://"), format="iceberg")
    assert source.url == f"{s3_url}/redpanda/payments"
    assert read_all(source) == expected(records)


def test_inspect_and_verify_commands_take_an_iceberg_table(tmp_path, capsys):
    from keyfill.cli import main

    records = topic_records(5, partitions=2, per_partition=30)
    table = write_table(tmp_path, records, files=3)
    for url in (metadata_file(table), f"sqlite:///{tmp_path}/catalog.db#redpanda.payments"):
        assert main(["inspect", url, "--format", "iceberg", "--json", "--no-progress"]) == 0
        s = json.loads(capsys.readouterr().out)
        assert s["records"] == 60
        assert [(p["partition"], p["records"], p["first_offset"], p["last_offset"]) for p in s["partitions"]] == [
            (p, len(v), v[0][0], v[-1][0]) for p, v in sorted(records.items())
        ]


def test_a_catalog_configured_for_pyiceberg_is_named_catalog_name(tmp_path):
    """`catalog://NAME#ns.table`: the catalog pyiceberg's own configuration gives NAME (here
    its environment variables, read when pyiceberg is imported: a fresh process), the way a
    REST, Glue or Hive catalog is configured; an unconfigured name is one line naming it."""
    import subprocess
    import sys

    records = topic_records(6, partitions=2, per_partition=20)
    write_table(tmp_path, records, files=2)
    env = dict(
        os.environ,
        PYICEBERG_CATALOG__DEFAULT__TYPE="sql",
        PYICEBERG_CATALOG__DEFAULT__URI=f"sqlite:///{tmp_path}/catalog.db",
    )
    env["PYICEBERG_CATALOG__DEFAULT__INIT_CATALOG_TABLES"] = "false"
    run = [sys.executable, "-m", "keyfill", "inspect", "--format", "iceberg", "--json", "--no-progress"]
    done = subprocess.run([*run, "catalog://default#redpanda.payments"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["records"] == 40
    done = subprocess.run([*run, "catalog://prod#redpanda.payments"], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "cannot open pyiceberg catalog 'prod'" in done.stderr
    assert "PYICEBERG_CATALOG__PROD__*" in done.stderr and len(done.stderr.strip().splitlines()) == 1


# --- bad tables ---------------------------------------------------------------------------


def test_a_missing_data_file_is_named(tmp_path):
    table = write_table(tmp_path, topic_records(6), files=3)
    victim = sorted(glob.glob(f"{tmp_path}/warehouse/redpanda/payments/data/*.parquet"))[1]
    os.remove(victim)
    with pytest.raises(ArchiveError, match=rf"{victim}: cannot read the data file"):
        read_all(IcebergSource(metadata_file(table)))


def test_duplicate_partition_offset_rows_are_named(tmp_path):
    records = topic_records(7, partitions=2, per_partition=20)
    table = write_table(tmp_path, records, files=2)
    again = redpanda_rows({1: records[1][5:6]})
    table.append(pa.Table.from_pylist(again, schema=table.schema().as_arrow()))
    source = IcebergSource(metadata_file(catalog(tmp_path).load_table("redpanda.payments")))
    offset = records[1][5][0]
    with pytest.raises(CorruptFile, match=rf"\.parquet: partition 1 offset {offset} appears more than once"):
        read_all(source)


def test_tables_without_the_needed_fields_are_refused_naming_the_metadata_file(tmp_path):
    no_offset = write_table(tmp_path / "a", {0: []}, schema=redpanda_schema(offset=None), files=1)
    with pytest.raises(
        ArchiveError,
        match=r"\.metadata\.json: offset is column 'redpanda\.offset' in the 'redpanda' layout, which the table lacks",
    ):
        IcebergSource(metadata_file(no_offset))
    text = write_table(tmp_path / "t", {0: []}, schema=redpanda_schema(offset=StringType), files=1)
    with pytest.raises(
        ArchiveError, match=r"\.metadata\.json: offset column 'redpanda\.offset' is (large_)?string, not an integer"
    ):
        IcebergSource(metadata_file(text))
    cat = catalog(tmp_path / "b")
    cat.create_namespace("redpanda")
    plain = cat.create_table("redpanda.plain", Schema(NestedField(1, "value", BinaryType(), required=False)))
    with pytest.raises(
        ArchiveError, match=r"\.metadata\.json: the table has the columns of no writer keyfill knows \(kafka: partition"
    ):
        IcebergSource(metadata_file(plain))
    with pytest.raises(ArchiveError, match=r"nothing\.metadata\.json: cannot read the Iceberg metadata file"):
        IcebergSource(str(tmp_path / "nothing.metadata.json"))
    with pytest.raises(ArchiveError, match=r"catalog 'default' has no table redpanda\.missing"):
        IcebergSource(f"sqlite:///{tmp_path}/b/catalog.db#redpanda.missing")
    with pytest.raises(ArchiveError, match=r"no SQLite catalog file"):
        IcebergSource(f"sqlite:///{tmp_path}/none.db#redpanda.plain")
