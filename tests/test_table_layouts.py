"""Table sources in each writer's columns (compactor.sources.table_layouts): Confluent
Tableflow, the Iceberg Kafka Connect sink's metadata struct, Aiven's Iceberg topics, Spark's
Kafka source, as Iceberg tables (on local folders, GCS and Azure, through keyfill's FileIO)
and as Delta tables: every record once, each partition in offset order, each field where
the writer put it; a mapping that names a column the table lacks refused naming both."""

from __future__ import annotations

import datetime as dt
import random
import uuid

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog.sql import SqlCatalog

from compactor.errors import ArchiveError
from compactor.job import CompactConfig, compact
from compactor.sources import open_source
from compactor.sources.iceberg.table import io_properties
from compactor.sources.kafka_connect.avro import encode_json
from compactor.sources.table_layouts import parse_columns, resolve
from compactor.verify import verify
from keygroups.errors import OptionError
from keygroups.storage import open_storage
from tests.records import replayed

T0_MS = 1_767_225_600_000  # 2026-01-01
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def topic(partitions: int, per_partition: int, seed: int = 0) -> list[dict]:
    """Records of a topic with offset gaps, null keys at times, headers on some."""
    rng = random.Random(seed)
    out = []
    for p in range(partitions):
        offset = rng.randrange(5)
        for i in range(per_partition):
            user = None if rng.random() < 0.05 else f"u{rng.randrange(9)}"
            headers = [(f"h{j}", b"x%d" % i) for j in range(rng.randrange(3))]
            out.append(dict(p=p, o=offset, ts=T0_MS + i * 1000 + rng.randrange(500), user=user, amount=i, h=headers))
            offset += 1 + (rng.random() < 0.1)
    return out


def value_json(r: dict) -> bytes:
    return encode_json({"amount": r["amount"], "user": r["user"]}).encode()


def ts(rows: list[dict]) -> pa.Array:
    return pa.array(
        [dt.datetime.fromtimestamp(r["ts"] / 1000, dt.timezone.utc) for r in rows], pa.timestamp("us", "UTC")
    )


def value_fields(rows: list[dict]) -> dict[str, pa.Array]:
    return {
        "amount": pa.array([r["amount"] for r in rows], pa.int64()),
        "user": pa.array([r["user"] for r in rows], pa.string()),
    }


def key_bytes(rows: list[dict]) -> pa.Array:
    return pa.array([None if r["user"] is None else r["user"].encode() for r in rows], pa.binary())


def tableflow(rows: list[dict]) -> pa.Table:
    """Tableflow's default naming: the value's fields, a binary key (no key schema), then
    its $$ system columns, the raw key and value among them."""
    return pa.table(
        {
            **value_fields(rows),
            "key": key_bytes(rows),
            "$$topic": pa.array(["payments"] * len(rows)),
            "$$partition": pa.array([r["p"] for r in rows], pa.int32()),
            "$$headers": pa.array([r["h"] for r in rows], pa.map_(pa.string(), pa.binary())),
            "$$leader-epoch": pa.array([0] * len(rows), pa.int32()),
            "$$offset": pa.array([r["o"] for r in rows], pa.int64()),
            "$$timestamp": ts(rows),
            "$$timestamp-type": pa.array(["CreateTime"] * len(rows)),
            "$$raw-key": key_bytes(rows),
            "$$raw-value": pa.array([value_json(r) for r in rows], pa.binary()),
        }
    )


def tableflow_portable(rows: list[dict]) -> pa.Table:
    """Tableflow's portable naming (cflt_metadata_…), without the raw columns: the value is
    the JSON of its fields, the key the key column."""
    t = tableflow(rows).drop_columns(["$$raw-key", "$$raw-value"])
    return t.rename_columns([c.replace("$$", "cflt_metadata_").replace("-", "_") for c in t.column_names])


def kafka_connect(rows: list[dict]) -> pa.Table:
    """The Iceberg sink with KafkaMetadataTransform (nested): the value's fields and a
    _kafka_metadata struct; no key, no headers."""
    meta = pa.StructArray.from_arrays(
        [
            pa.array(["payments"] * len(rows)),
            pa.array([r["p"] for r in rows], pa.int32()),
            pa.array([r["o"] for r in rows], pa.int64()),
            pa.array([r["ts"] for r in rows], pa.int64()),
        ],
        names=["topic", "partition", "offset", "timestamp"],
    )
    return pa.table({**value_fields(rows), "_kafka_metadata": meta})


def kafka_connect_flat(rows: list[dict]) -> pa.Table:
    t = kafka_connect(rows)
    meta = t.column("_kafka_metadata").combine_chunks()
    flat = {f"_kafka_metadata_{f.name}": meta.field(f.name) for f in meta.type}
    return pa.table({**value_fields(rows), **flat})


def aiven(rows: list[dict]) -> pa.Table:
    """Aiven's Iceberg topics: a kafka struct with the batch's fields, headers, the key as
    bytes (no key schema), the value decoded as a struct."""
    n = len(rows)
    kafka = pa.StructArray.from_arrays(
        [
            pa.array([r["p"] for r in rows], pa.int32()),
            pa.array([r["o"] for r in rows], pa.int64()),
            pa.array([r["ts"] for r in rows], pa.int64()),
            pa.array([0] * n, pa.int32()),
            pa.array([0] * n, pa.int32()),
        ],
        names=["partition", "offset", "timestamp", "batch_byte_offset", "batch_timestamp_type"],
    )
    value = pa.StructArray.from_arrays(list(value_fields(rows).values()), names=["amount", "user"])
    return pa.table(
        {"kafka": kafka, "headers": pa.array([r["h"] for r in rows], HEADERS), "key": key_bytes(rows), "value": value}
    )


def bronze(rows: list[dict]) -> pa.Table:
    """Spark's Kafka source's columns, as a bronze job writes them."""
    return pa.table(
        {
            "key": key_bytes(rows),
            "value": pa.array([value_json(r) for r in rows], pa.binary()),
            "topic": pa.array(["payments"] * len(rows)),
            "partition": pa.array([r["p"] for r in rows], pa.int32()),
            "offset": pa.array([r["o"] for r in rows], pa.int64()),
            "timestamp": ts(rows),
            "timestampType": pa.array([0] * len(rows), pa.int32()),
            "headers": pa.array([r["h"] for r in rows], HEADERS),
        }
    )


# writer -> (its rows, the --columns it needs (None: found from the columns), whether it keeps the key, headers)
WRITERS = {
    "tableflow": (tableflow, None, True, True),
    "tableflow-portable": (tableflow_portable, None, True, True),
    "iceberg-kafka-connect": (kafka_connect, "iceberg-kafka-connect,key=user", True, False),
    "iceberg-kafka-connect-flat": (kafka_connect_flat, None, False, False),
    "aiven": (aiven, None, True, True),
    "kafka": (bronze, None, True, True),
}


def expected(records: list[dict], writer: str) -> list[tuple]:
    _, _, has_key, has_headers = WRITERS[writer]
    return sorted(
        (
            r["p"],
            r["o"],
            r["ts"],
            key_bytes([r])[0].as_py() if has_key else None,
            value_json(r),
            r["h"] if has_headers else [],
        )
        for r in records
    )


def read_all(source) -> list[tuple]:
    out = []
    for chunk in source.list_chunks():
        batch = source.read(chunk)
        offsets = batch.column("offset").to_pylist()
        assert offsets == sorted(offsets) and set(batch.column("partition").to_pylist()) <= {chunk.partition}
        for r in batch.to_pylist():
            ms = round(r["timestamp"].timestamp() * 1000)
            out.append(
                (r["partition"], r["offset"], ms, r["key"], r["value"], [(h["key"], h["value"]) for h in r["headers"]])
            )
    return sorted(out)


def iceberg_table(warehouse: str, catalog_dir, writer: str, records: list[dict], commits: int, seed: int = 0) -> str:
    """The records shuffled over `commits` appends of an Iceberg table written by pyiceberg
    in the writer's columns; the table's catalog URL."""
    rows, *_ = WRITERS[writer]
    cat = SqlCatalog(
        "default",
        uri=f"sqlite:///{catalog_dir}/catalog.db",
        warehouse=warehouse,
        **io_properties(),
    )
    cat.create_namespace_if_not_exists("kafka")
    table = cat.create_table_if_not_exists("kafka.payments", rows(records[:1]).schema)
    append_shuffled(table, writer, records, commits, seed)
    return f"sqlite:///{catalog_dir}/catalog.db#kafka.payments"


def append_shuffled(table, writer: str, records: list[dict], commits: int, seed: int) -> None:
    rows, *_ = WRITERS[writer]
    shuffled = records[:]
    random.Random(seed).shuffle(shuffled)
    for i in range(commits):
        if shuffled[i::commits]:
            table.append(rows(shuffled[i::commits]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    writer=st.sampled_from(sorted(WRITERS)),
    table_format=st.sampled_from(["iceberg", "delta"]),
    partitions=st.integers(1, 3),
    per_partition=st.integers(1, 40),
    commits=st.integers(1, 4),
    chunk_records=st.integers(3, 100),
    seed=st.integers(0, 2**16),
)
def test_each_writers_table_reads_as_the_topic(
    tmp_path_factory, writer, table_format, partitions, per_partition, commits, chunk_records, seed
):
    """Invariant: whichever writer laid the table out, as Iceberg or Delta, however its rows
    fell into files and chunks, each record is read once with its fields, in offset order."""
    records = topic(partitions, per_partition, seed)
    root = tmp_path_factory.mktemp("t")
    columns = WRITERS[writer][1]
    if table_format == "iceberg":
        url = iceberg_table(str(root / "warehouse"), root, writer, records, commits, seed)
    else:
        url = str(root / "payments")
        shuffled = records[:]
        random.Random(seed).shuffle(shuffled)
        for i in range(commits):
            if shuffled[i::commits]:
                write_deltalake(url, WRITERS[writer][0](shuffled[i::commits]), mode="append")
    source = open_source(url, format=table_format, options={"columns": columns} if columns else None)
    source.chunk_records = chunk_records
    assert read_all(source) == expected(records, writer)


@pytest.mark.parametrize("writer", ["tableflow", "iceberg-kafka-connect"])
def test_an_iceberg_table_compacts_appends_and_verifies_on_every_store(writer, any_store_url, tmp_path, request):
    """Metadata, manifests and data files on the store (GCS and Azure read through keyfill's
    FileIO, S3 through pyarrow's with the endpoint from the AWS environment): a
    compaction, two later commits, an append, verify, a replay of every record once in
    each key's offset order."""
    if any_store_url.startswith("az://"):  # as Iceberg's Java writers name Azure: abfss://container@account.dfs…
        container = any_store_url.removeprefix("az://").split("/")[0]
        warehouse = f"abfss://{container}@devstoreaccount1.dfs.core.windows.net/t-{uuid.uuid4().hex[:8]}"
    else:
        warehouse = any_store_url
    records = topic(3, 150, seed=7)
    first = [r for r in records if r["o"] < 100]
    src = iceberg_table(warehouse, tmp_path, writer, first, commits=3)
    columns = WRITERS[writer][1]
    opts = {"columns": columns} if columns else {}
    source = open_source(src, format="iceberg", options=opts or None)
    assert source.url.startswith(warehouse.rstrip("/"))
    dest = str(tmp_path / "c")
    cfg = dict(source=src, dest=dest, source_format="iceberg", source_options=opts)
    r = compact(CompactConfig(**cfg, groups=3, slice_duration="20s"))
    assert 0 < r.records <= len(first)
    cat = SqlCatalog(
        "default",
        uri=f"sqlite:///{tmp_path}/catalog.db",
        **io_properties(),
    )
    append_shuffled(cat.load_table("kafka.payments"), writer, [r for r in records if r["o"] >= 100], 2, seed=3)
    r = compact(CompactConfig(**cfg, append=True, seal_all=True))
    assert r.kind == "append" and r.records == len(records)
    report = verify(open_source(src, format="iceberg", options=opts or None), open_storage(dest))
    assert report.ok, report.violations
    seen = replayed(dest)
    assert sorted(seen) == sorted((r["p"], r["o"]) for r in records) and len(seen) == len(set(seen))


def test_a_mapping_names_what_the_table_lacks_and_bad_mappings_are_refused(tmp_path):
    schema = kafka_connect(topic(1, 1)).schema
    lacks = r"t: key is column 'user_id' in the 'iceberg-kafka-connect\+' layout, which the table lacks"
    with pytest.raises(ArchiveError, match=lacks + r" \(its columns: amount, user, _kafka_metadata\)"):
        resolve("iceberg-kafka-connect,key=user_id", schema, "t")
    with pytest.raises(ArchiveError, match=r"t: offset column 'user' is string, not an integer"):
        resolve("partition=_kafka_metadata.partition,offset=user,timestamp=_kafka_metadata.timestamp", schema, "t")
    with pytest.raises(
        ArchiveError, match=r"the columns of no writer keyfill knows \(kafka: partition, offset, timestamp; redpanda"
    ):
        resolve(None, pa.schema([("a", pa.int64())]), "t")
    for bad, message in [
        ("debezium", r"no preset 'debezium'; the presets are kafka, redpanda, tableflow"),
        ("offset=o,timestamp=t", r"names no column for partition"),
        ("kafka,offset=", r"drops a column of partition, offset, timestamp"),
        ("kafka,size=len", r"'size=len' is not field=column"),
    ]:
        with pytest.raises(OptionError, match=message):
            parse_columns(bad)
    # a mapping of its own: the value decoded into columns, a key from one of them
    layout = resolve(
        "partition=_kafka_metadata.partition,offset=_kafka_metadata.offset,timestamp=_kafka_metadata.timestamp,key=user",
        schema,
        "t",
    )
    assert (layout.key, layout.value, layout.headers) == ("user", None, None)
    # a preset whose optional columns an older writer lacks: those are none
    assert resolve(None, bronze(topic(1, 1)).drop_columns(["headers", "topic"]).schema, "t").paths() == {
        "partition": "partition",
        "offset": "offset",
        "timestamp": "timestamp",
        "key": "key",
        "value": "value",
    }


def test_a_tableflow_delta_table_on_azure_compacts_on_spark_and_the_spark_source_reads_it(spark, azure_url, tmp_path):
    """Tableflow writes Delta too: the table on Azurite (written locally, then copied: the
    layout, not the store, is under test), compacted by a Spark job, read back by the
    `format("keyfill")` source: each record once, with the key and value bytes the table
    holds and its $$topic as the topic."""
    import reader.spark
    from tests.test_delta_source import copy_table

    records = topic(3, 60, seed=11)
    lake = str(tmp_path / "lake")
    write_deltalake(lake, tableflow(records[::2]))
    write_deltalake(lake, tableflow(records[1::2]), mode="append")
    url = f"{azure_url}/tableflow/payments"
    copy_table(lake, url)
    dest = f"{azure_url}/compacted"
    r = compact(
        CompactConfig(source=url, dest=dest, source_format="delta", groups=3, slice_duration="20s", seal_all=True),
        spark,
    )
    assert r.records == len(records)
    reader.spark.register(spark)
    rows = spark.read.format("keyfill").option("includeHeaders", "true").load(dest).toArrow()
    assert set(rows.column("topic").to_pylist()) == {"payments"}
    got = sorted(zip(*(rows.column(c).to_pylist() for c in ("partition", "offset", "key", "value"))))
    assert got == sorted((p, o, k, v) for p, o, _, k, v, _ in expected(records, "tableflow"))
    headers = {
        (p, o): [(h["key"], h["value"]) for h in hs]
        for p, o, hs in zip(*(rows.column(c).to_pylist() for c in ("partition", "offset", "headers")))
    }
    assert headers == {(r["p"], r["o"]): r["h"] for r in records}


@pytest.mark.parametrize("table_format", ["iceberg", "delta"])
def test_an_append_reads_the_new_rows_in_the_columns_the_archive_was_read_in(table_format, tmp_path):
    """The layout is the archive's (its manifest records `--columns`): an append that does
    not repeat `key=user` still keys the new records by user, so each key stays in one group."""
    records = topic(2, 80, seed=5)
    first, later = [r for r in records if r["o"] < 50], [r for r in records if r["o"] >= 50]
    columns = {"columns": "iceberg-kafka-connect,key=user"}
    if table_format == "iceberg":
        src = iceberg_table(str(tmp_path / "warehouse"), tmp_path, "iceberg-kafka-connect", first, commits=2)
    else:
        src = str(tmp_path / "payments")
        write_deltalake(src, kafka_connect(first))
    dest = str(tmp_path / "c")
    base = dict(source=src, dest=dest, source_format=table_format)
    compact(CompactConfig(**base, source_options=columns, groups=4, slice_duration="20s"))
    if table_format == "iceberg":
        cat = SqlCatalog("default", uri=f"sqlite:///{tmp_path}/catalog.db", **io_properties())
        append_shuffled(cat.load_table("kafka.payments"), "iceberg-kafka-connect", later, 2, seed=1)
    else:
        write_deltalake(src, kafka_connect(later), mode="append")
    r = compact(CompactConfig(**base, append=True, seal_all=True))
    assert r.records == len(records)
    report = verify(open_source(src, format=table_format, options=columns), open_storage(dest))
    assert report.ok, report.violations
