"""The Spark source (`format("keyfill")`) on a real local[2] Spark: exactly once, whole
slices per micro-batch, per-key order, restarts from a checkpoint, windowed results equal to
a batch computation over the source, admission control and clear errors."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql.datasource import EqualTo
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxFiles, ReadMaxRows
from test_reader import hypothesis_settings, source_table

import reader.fetched_span
import reader.spark
import reader.spark.enumerator
import reader.spark.planning_process as planning_process
import reader.spark.rows
from compactor.job import CompactConfig, compact
from keyfill.synth.generate import GeneratorConfig, generate
from keygroups import compacted
from keygroups.storage import open_storage
from reader.fetch import read_groups
from tests.connect_client import CONNECT
from tests.records import archive_metas, below_handoff

JITTER_MS = 4_000


@pytest.fixture(scope="module")
def archive(spark, tmp_path_factory):
    """~12 slices of 20 s over 3 partitions, skewed keys, null keys, headers, jitter."""
    reader.spark.register(spark)
    root = tmp_path_factory.mktemp("spark-source")
    src = str(root / "src")
    generate(
        GeneratorConfig(
            out=src,
            records=24_000,
            keys=400,
            partitions=3,
            chunk_records=4_000,
            skew=1.2,
            null_keys=0.03,
            jitter_ms=JITTER_MS,
            headers=True,
            rate=100.0,
            seed=11,
        ),
        progress=False,
    )
    dest = str(root / "compacted")
    compact(CompactConfig(source=src, dest=dest, groups=6, slice_duration="20s"), spark)
    return dest, below_handoff(source_table(src), dest)


def identity(table: pa.Table) -> list[tuple]:
    """Each record as a comparable tuple: everything the source holds."""
    cols = [table.column(c).to_pylist() for c in ("partition", "offset", "key", "value")]
    ts = table.column("timestamp").cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_pylist()
    headers = [tuple((h["key"], h["value"]) for h in hs) for hs in table.column("headers").to_pylist()]
    return sorted(zip(cols[0], cols[1], ts, cols[2], cols[3], headers))


def stream(spark, url: str, **options: str):
    r = spark.readStream.format("keyfill").option("includeHeaders", "true")  # what `identity` compares
    for k, v in options.items():
        r = r.option(k, v)
    return r.load(url)


def run_collecting(df, checkpoint: str) -> list[tuple[int, pa.Table]]:
    """Run an AvailableNow query; return each micro-batch's rows in the order Spark hands
    them to the sink (Spark partition by partition, each in its read order)."""
    batches: list[tuple[int, pa.Table]] = []
    (
        df.writeStream.foreachBatch(lambda b, i: batches.append((i, b.toArrow())))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    return batches


def test_batch_read_is_the_source_with_groups_and_slices(spark, archive):
    batch_read_is_the_source(spark, archive)


@CONNECT
def test_batch_read_over_spark_connect_is_the_source(connect, archive):
    connect.run(batch_read_is_the_source, archive)


def batch_read_is_the_source(spark, archive) -> None:
    url, src = archive
    kafka = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    plain = spark.read.format("keyfill").load(url)  # Spark's Kafka source's columns, headers only when asked
    assert [(f.name, f.dataType.simpleString()) for f in plain.schema.fields] == list(
        zip(
            kafka + ["key_group", "slice"],
            ["binary", "binary", "string", "int", "bigint", "timestamp", "int", "int", "int"],
        )
    )
    df = spark.read.format("keyfill").option("includeHeaders", "true").load(url)
    assert [f.name for f in df.schema.fields] == kafka + ["headers", "key_group", "slice"]
    assert df.schema["headers"].dataType.simpleString() == "array<struct<key:string,value:binary>>"
    topic = compacted.load_manifest(open_storage(url)).topic
    assert plain.groupBy("topic", "timestampType").count().collect() == [(topic, 0, src.num_rows)]
    cols = ("partition", "offset", "key", "value")  # headers not decoded: the rest as the source holds it
    bare = plain.toArrow()
    assert sorted(zip(*(bare.column(c).to_pylist() for c in cols))) == sorted(
        zip(*(src.column(c).to_pylist() for c in cols))
    )
    got = df.toArrow()
    assert identity(got) == identity(src)
    for meta in archive_metas(open_storage(url)):  # every record carries its slice and group
        in_slice = got.filter(pc.equal(got.column("slice"), meta.slice))
        assert in_slice.num_rows == meta.records
        assert dict(Counter(in_slice.column("key_group").to_pylist())) == {p.group: p.records for p in meta.pieces}


@pytest.mark.parametrize(
    "options",
    [{"maxSlicesPerTrigger": "3"}, {"maxBytesPerTrigger": "1"}, {"maxSlicesPerTrigger": "2", "numPartitions": "2"}],
)
def test_available_now_writes_whole_slices_exactly_once_in_key_order(spark, archive, tmp_path, options):
    url, src = archive
    metas = archive_metas(open_storage(url))
    batches = run_collecting(stream(spark, url, **options), str(tmp_path / "ck"))
    assert len(batches) > 1
    assert identity(pa.concat_tables([t for _, t in batches])) == identity(src)  # exactly once
    seen_slices: list[int] = []
    last: dict = {}
    for _, t in sorted(batches, key=lambda b: b[0]):
        slices = Counter(t.column("slice").to_pylist())
        # whole slices: every slice of the batch is complete, and batches follow slice order
        assert all(n == metas[s].records for s, n in slices.items())
        assert not seen_slices or min(slices) > max(seen_slices)
        if "maxSlicesPerTrigger" in options:
            assert len(slices) <= int(options["maxSlicesPerTrigger"])
        if "maxBytesPerTrigger" in options:  # every slice is above 1 byte: one per batch
            assert len(slices) == 1
        seen_slices.extend(slices)
        # per-key order: within a Kafka partition, a key's offsets rise in sink order
        for k, p, o in zip(
            t.column("key").to_pylist(), t.column("partition").to_pylist(), t.column("offset").to_pylist()
        ):
            assert o > last.get((k, p), -1), (k, p, o)
            last[(k, p)] = o


def test_windowed_counts_equal_a_batch_computation_over_the_source(spark, archive, tmp_path):
    """With a watermark delay of the source's own out-of-orderness, nothing may be dropped
    as late: whole-slice micro-batches keep Spark's watermark behind every record to come."""
    url, src = archive
    windows = (
        stream(spark, url, maxSlicesPerTrigger="3")
        .withWatermark("timestamp", f"{JITTER_MS} milliseconds")
        .groupBy(F.window("timestamp", "30 seconds"), "key")
        .count()
    )
    final: dict = {}

    def keep(batch, _):
        for r in batch.collect():
            final[(r["window"]["start"], r["key"])] = r["count"]

    (
        windows.writeStream.outputMode("update")
        .foreachBatch(keep)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    ts = src.column("timestamp").cast(pa.int64()).to_numpy()
    starts = ts - ts % 30_000
    expected = Counter(zip(starts.tolist(), src.column("key").to_pylist()))
    got = {(int(w.timestamp() * 1000), k): n for (w, k), n in final.items()}
    assert len(got) > 50
    assert got == dict(expected)


HEADERS_DDL = "array<struct<key:string,value:binary>>"


def test_a_query_schema_of_fewer_columns_reads_them_alone(spark, archive, tmp_path):
    schema_of_fewer_columns(spark, archive, str(tmp_path))


@CONNECT
def test_a_query_schema_of_fewer_columns_over_spark_connect(connect, archive, tmp_path):
    connect.run(schema_of_fewer_columns, archive, str(tmp_path))


def schema_of_fewer_columns(spark, archive, work: str) -> None:
    """`.schema(...)` naming some of the source's columns, in any order: the rows are the
    source's with those columns alone (Spark refuses a batch of others), and `headers` is
    decoded when the schema has it (no includeHeaders); a column the source has not is
    refused by name."""
    url, src = archive
    asked = f"timestamp timestamp, headers {HEADERS_DDL}, offset long, partition int"
    df = spark.read.format("keyfill").schema(asked).load(url)
    assert df.columns == ["timestamp", "headers", "offset", "partition"], df.columns
    got = df.toArrow()
    full = spark.read.format("keyfill").option("includeHeaders", "true").load(url).toArrow()
    assert sorted(got.to_pylist(), key=str) == sorted(full.select(df.columns).to_pylist(), key=str), "rows"
    assert got.num_rows == src.num_rows, got.num_rows
    few = spark.readStream.format("keyfill").option("maxSlicesPerTrigger", "4").schema("value binary, key binary")
    out, ck = f"{work}/out", f"{work}/ck"
    q = few.load(url).writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
    q = q.trigger(availableNow=True).start()
    q.awaitTermination()
    batches = [p.numInputRows for p in q.recentProgress]  # (over Connect the dict holds None)
    assert len([n for n in batches if n]) > 1, batches  # the schema holds from batch to batch
    written = spark.read.parquet(out).toArrow()
    assert written.column_names == ["value", "key"], written.column_names
    rows = Counter(zip(written.column("key").to_pylist(), written.column("value").to_pylist()))
    assert rows == Counter(zip(src.column("key").to_pylist(), src.column("value").to_pylist())), "streamed"
    with pytest.raises(Exception, match="no column 'Key' \\(it has 'key'"):
        spark.read.format("keyfill").schema("Key binary").load(url).count()


@pytest.mark.parametrize(
    "given, named",
    [
        ([("key", "binary", True), ("colour", "string", True)], "no column 'colour'; a schema names some of key, "),
        ([("offset", "int", True)], "column offset is bigint in the keyfill source, not int"),
        ([("headers", "array<string>", True)], f"column headers is {HEADERS_DDL} in the keyfill source"),
        ([("partition", "int", False)], "column partition NOT NULL"),
        ([("key", "binary", True), ("key", "binary", True)], "a column named twice in key, key"),
        ([], "schema: no column; a schema names some of key, value, topic"),
    ],
)
def test_a_query_schema_the_source_cannot_give_is_refused_naming_the_column(given, named):
    with pytest.raises(reader.spark.DataSourceOptionError, match=re.escape(named)):
        reader.spark.Options.parse({"path": "x"}).with_schema(given)


def test_restart_from_checkpoint_after_k_batches_is_exactly_once(spark, archive, tmp_path):
    restart_after_k_batches(spark, archive, str(tmp_path))


@CONNECT
def test_restart_from_checkpoint_over_spark_connect_is_exactly_once(connect, archive, tmp_path):
    connect.run(restart_after_k_batches, archive, str(tmp_path))


def restart_after_k_batches(spark, archive, work: str) -> None:
    url, src = archive
    out, ck = f"{work}/out", f"{work}/ck"
    df = stream(spark, url, maxSlicesPerTrigger="1")
    # A batch every 2 s at most: the ~12 slices take 20 s or more, so the stop below comes
    # part-way however long this thread takes to see batch 1 (back-to-back batches could all
    # finish within one slow poll on a busy machine)
    q = (
        df.writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", ck)
        .trigger(processingTime="2 seconds")
        .start()
    )
    deadline = time.time() + 300
    while (q.lastProgress or {}).get("batchId", -1) < 1 and time.time() < deadline:
        time.sleep(0.2)
    q.stop()
    first = spark.read.parquet(out).count()
    assert 0 < first < src.num_rows, "the stop should come part-way"
    (
        stream(spark, url, maxSlicesPerTrigger="4")
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", ck)
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    assert identity(spark.read.parquet(out).toArrow()) == identity(src)


@pytest.mark.parametrize("backend", ["s3", "gcs", "azure"])
def test_streaming_from_an_object_store(spark, archive, request, backend, tmp_path):
    url, src = archive
    remote_url = request.getfixturevalue(f"{backend}_url")
    local, remote = open_storage(url), open_storage(remote_url)
    for info in local.list(""):
        remote.write(info.key, local.read(info.key))
    batches = run_collecting(stream(spark, remote_url, maxSlicesPerTrigger="5"), str(tmp_path / "ck"))
    assert identity(pa.concat_tables([t for _, t in batches])) == identity(src)


def test_a_corrupt_file_fails_the_query_naming_it(spark, archive, tmp_path):
    url, _ = archive
    local, copy = open_storage(url), open_storage(str(tmp_path / "copy"))
    for info in local.list(""):
        copy.write(info.key, local.read(info.key))
    piece = archive_metas(copy)[1].pieces[0]
    data = bytearray(copy.read(piece.file))
    middle = piece.offset + piece.length // 2
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    copy.write(piece.file, bytes(data))
    with pytest.raises(Exception) as err:
        spark.read.format("keyfill").load(copy.url).count()
    assert f"{piece.file} bytes {piece.offset}..{piece.end} (slice 1, group {piece.group})" in str(err.value)


def test_option_errors_name_the_option(spark, tmp_path):
    reader.spark.register(spark)  # also when run alone
    with pytest.raises(Exception, match="maxSlicesPerTrigger"):
        (
            stream(spark, str(tmp_path), maxSlicesPerTrigger="lots")
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
            .awaitTermination(300)  # it fails as it starts: seconds, or a minute on a busy machine
        )
    with pytest.raises(reader.spark.DataSourceOptionError, match="numPartitions"):
        reader.spark.Options.parse({"path": "x", "numPartitions": "0"})
    with pytest.raises(reader.spark.DataSourceOptionError, match="archive URL"):
        reader.spark.Options.parse({})
    misspelt = r"unknown option maxSlicesPerTriger \(maxSlicesPerTriger: did you mean maxSlicesPerTrigger\?\); .*, max"
    with pytest.raises(reader.spark.DataSourceOptionError, match=misspelt):
        reader.spark.Options.parse({"path": "x", "maxSlicesPerTriger": "4"})  # misspelt: not silently ignored
    # without a limit, micro-batches are sized by bytes, as Spark's Kafka source sizes them by offsets
    default = reader.spark.KeyfillStreamReader(reader.spark.Options.parse({"path": "x"})).getDefaultReadLimit()
    assert isinstance(default, ReadMaxBytes) and default.max_bytes == reader.spark.DEFAULT_MAX_BYTES_PER_TRIGGER
    with pytest.raises(Exception, match="_versions"):
        spark.read.format("keyfill").load(str(tmp_path)).count()


# --- planning, without Spark: admission control and partitions ----------------------------


@hypothesis_settings(300)
@given(
    limit=st.one_of(
        st.just(ReadAllAvailable()),
        st.builds(ReadMaxFiles, st.integers(1, 5)),
        st.builds(ReadMaxBytes, st.integers(1, 2_000_000)),
        st.builds(ReadMaxRows, st.integers(1, 5_000)),
    ),
    max_slices=st.none() | st.integers(1, 4),
    parts=st.none() | st.integers(1, 8),
    start=st.integers(0, 3),
)
def test_planning_takes_whole_slices_within_limits_and_reads_every_file_once(archive, limit, max_slices, parts, start):
    url, _ = archive
    opts = {"path": url, "startingSlice": str(start)}
    if max_slices:
        opts["maxSlicesPerTrigger"] = str(max_slices)
    if parts:
        opts["numPartitions"] = str(parts)
    rdr = reader.spark.KeyfillStreamReader(reader.spark.Options.parse(opts))
    manifest = rdr.archive.manifest
    metas = archive_metas(rdr.archive.store)
    offset = rdr.initialOffset()
    assert offset["slice"] == start
    seen = []
    while True:
        end = rdr.latestOffset(offset, limit)
        assert json.loads(json.dumps(end)) == end
        if end == offset:
            break
        assert end["archive"] == offset["archive"]
        taken = [s for s in range(offset["slice"], end["slice"]) if metas[s].records]
        assert taken, "every batch holds at least one slice with records"
        last = metas[end["slice"] - 1]
        assert last.records or end["slice"] == manifest.slices  # empty slices only ride along
        if len(taken) > 1:  # beyond one slice, the limits hold
            if isinstance(limit, ReadMaxFiles):
                assert len(taken) <= limit.max_files
            if isinstance(limit, ReadMaxBytes):
                assert sum(metas[s].bytes for s in taken) <= limit.max_bytes
            if isinstance(limit, ReadMaxRows):
                assert sum(metas[s].records for s in taken) <= limit.max_rows
            if max_slices and not isinstance(limit, (ReadAllAvailable, ReadMaxFiles)):
                assert len(taken) <= max_slices  # the option applies on top of other limits
        plan = rdr.partitions(offset, end)
        assert len(plan) <= (parts or manifest.groups)
        files = [(f.slice, f.group) for p in plan for f in p.pieces]
        expected = [(s, p.group) for s in range(offset["slice"], end["slice"]) for p in metas[s].pieces]
        assert sorted(files) == sorted(expected) and len(set(files)) == len(files)
        owners = defaultdict(set)
        for i, p in enumerate(plan):  # a group lives in one partition, its pieces read in slice order
            for g in {f.group for f in p.pieces}:
                owners[g].add(i)
                mine = [f.slice for f in p.pieces if f.group == g]
                assert mine == sorted(mine)
            in_order = [f.group for f in p.pieces]  # group after group: each group's pieces together
            assert in_order == sorted(in_order, key=in_order.index)
        assert all(len(o) == 1 for o in owners.values())
        seen.extend(files)
        offset = end
    assert offset["slice"] == manifest.slices
    assert len(seen) == sum(len(m.pieces) for m in metas[start:])


@hypothesis_settings(200)
@given(
    max_slices=st.none() | st.integers(1, 4),
    max_bytes=st.none() | st.integers(1, 2_000_000),
    max_rows=st.none() | st.integers(1, 5_000),
    start=st.integers(0, 3),
    paced=st.none() | st.integers(1, 4),
    restart_after=st.integers(0, 12),
)
def test_without_admission_control_the_source_bounds_its_batches_as_spark_would(
    archive, max_slices, max_bytes, max_rows, start, paced, restart_after
):
    """Spark 4.0 and 4.1 call `latestOffset()` with no arguments: before `initialOffset()` in
    a new query, after `partitions(X, X)` (X: the last logged end) in a restarted one. The
    source then walks the same batches as Spark 4.2's admission control with its default
    read limit, whatever the options (paced in event time too), and a restart goes on where
    the checkpoint is."""
    url, table = archive
    opts = {"path": url, "startingSlice": str(start)}
    limits = (("maxSlicesPerTrigger", max_slices), ("maxBytesPerTrigger", max_bytes))
    if paced is not None:  # event-time pacing: a stride of `paced` slices a batch, from a time, and no other limit
        first_ms = pc.min(table.column("timestamp").cast(pa.int64())).as_py()
        stride_ms = paced * compacted.load_manifest(open_storage(url)).slice_duration_ms
        opts = {"path": url, "maxEventTimePerTrigger": f"{stride_ms}ms", "startingTimestamp": str(first_ms)}
        limits = ()
    for name, value in limits:
        if value is not None:
            opts[name] = str(value)
    if max_rows is not None:
        opts["maxOffsetsPerTrigger"] = str(max_rows)
    options = reader.spark.Options.parse(opts)
    admitted = reader.spark.KeyfillStreamReader(options)
    offset, want = admitted.initialOffset(), []
    while (end := admitted.latestOffset(offset, admitted.getDefaultReadLimit())) != offset:
        want.append((offset, end))
        offset = end

    own = reader.spark.KeyfillStreamReader(options)
    end, got = own.latestOffset(), []  # a new query: the latest offset first
    offset = own.initialOffset()
    while end != offset:
        own.partitions(offset, end)
        got.append((offset, end))
        if len(got) == restart_after:  # a new planning process, told where the query is as Spark tells it
            own = reader.spark.KeyfillStreamReader(options)
            assert own.partitions(end, end) == []
        offset, end = end, own.latestOffset()
    assert json.loads(json.dumps(got)) == json.loads(json.dumps(want))


def test_bundled_partitions_are_balanced_by_bytes(archive):
    url, _ = archive
    rdr = reader.spark.KeyfillStreamReader(reader.spark.Options.parse({"path": url, "numPartitions": "2"}))
    plan = rdr.partitions(rdr.initialOffset(), rdr.archive.offset(rdr.archive.manifest.slices))
    groups_of = [{f.group for f in p.pieces} for p in plan]
    assert len(plan) == 2 and not groups_of[0] & groups_of[1]
    loads = [sum(f.length for f in p.pieces) for p in plan]
    per_group = defaultdict(int)
    for p in plan:
        for f in p.pieces:
            per_group[f.group] += f.length
    assert max(loads) - min(loads) <= max(per_group.values())  # no worse than one group's bytes
    assert np.sum(loads) == sum(rdr.archive.manifest.group_file_bytes)


def test_a_task_is_sent_the_options_and_filters_never_what_planning_loaded(archive):
    """PySpark pickles the reader that planned a batch read into every task: what it planned
    with (the manifest, index rows) must stay behind, and the copy must read alike."""
    url, _ = archive
    opts = reader.spark.Options.parse({"path": url})
    for make in (reader.spark.KeyfillBatchReader, reader.spark.KeyfillStreamReader):
        fresh, planned = make(opts), make(opts)
        if isinstance(planned, reader.spark.KeyfillBatchReader):
            parts = planned.partitions()
        else:
            start = planned.initialOffset()
            parts = planned.partitions(start, planned.latestOffset(start, ReadAllAvailable()))
        assert parts and planned.archive._manifest is not None
        assert pickle.dumps(planned) == pickle.dumps(fresh)
        copy = pickle.loads(pickle.dumps(planned))
        assert copy.archive._manifest is None and copy.opts == opts
        assert sum(b.num_rows for b in copy.read(parts[0])) == sum(b.num_rows for b in planned.read(parts[0]))
    pushing = reader.spark.KeyfillPushdownReader(opts)  # the filters a task applies go with it
    list(pushing.pushFilters([EqualTo(("partition",), 1)]))
    parts = pushing.partitions()
    copy = pickle.loads(pickle.dumps(pushing))
    assert copy.pushed == pushing.pushed and copy.pushed.exact and copy.archive._manifest is None
    rows = [r for b in copy.read(parts[0]) for r in b.column("partition").to_pylist()]
    assert rows and set(rows) == {1}


@pytest.mark.parametrize("step_bytes", [1, 3_000, reader.spark.rows.STEP_BYTES])
def test_a_task_decodes_steps_of_any_size_into_the_same_records(archive, step_bytes):
    """A Spark task decodes more pieces at once than a replay thread (`STEP_BYTES`): every
    step size yields each group's records once, in slice order, each step of whole pieces
    of one group, no more than `step_bytes` of them before its last."""
    url, _ = archive
    rdr = reader.spark.KeyfillBatchReader(reader.spark.Options.parse({"path": url}))
    store = open_storage(url)

    def decoded(pieces, step: int) -> tuple[list[tuple], list]:
        steps = list(read_groups(store, pieces, read_ahead_bytes=64 << 20, range_bytes=8 << 20, step_bytes=step))
        cols = ("partition", "offset", "key")
        return [r for _, b in steps for r in zip(*(b.column(c).to_pylist() for c in cols))], [p for p, _ in steps]

    for part in rdr.partitions():
        want, _ = decoded(part.pieces, reader.fetched_span.DECODE_BYTES)
        got, steps = decoded(part.pieces, step_bytes)
        assert got == want and len(got) == sum(p.records for p in part.pieces)
        for p in steps:
            assert len(set(p.group.tolist())) == 1 and (np.diff(p.slice) > 0).all()
            assert len(p) == 1 or int(p.length[:-1].sum()) < step_bytes


@given(st.lists(st.integers(0, 1 << 40), max_size=300), st.integers(1, 40))
@hypothesis_settings(300)
def test_bundles_are_no_further_apart_than_the_heaviest_group(weights, bundles):
    owner = reader.spark.enumerator.balance(weights, bundles)
    assert len(owner) == len(weights) and all(0 <= b < bundles for b in owner)
    loads = [sum(w for w, b in zip(weights, owner) if b == k) for k in range(bundles)]
    assert max(loads) - min(loads) <= max(weights, default=0)
    assert owner == reader.spark.enumerator.balance(list(weights), bundles)  # the same plan every time


def test_planning_a_streaming_query_loads_no_decoder_nor_pandas(archive):
    """Spark starts a Python process to plan each streaming query, and its start is the
    query's: planning a micro-batch must not load numba or its kernels (reader.spark.split_reader),
    nor, in that process, pandas (reader.spark.planning_process), and plans what any process plans."""
    url, _ = archive
    script = f"""
import importlib.machinery, json, pickle, sys
if sys.argv[1] == "runner":  # as `python -m` of Spark's runner module names this process
    sys.modules["__main__"].__spec__ = importlib.machinery.ModuleSpec(sys.argv[2], None)
import reader.spark
source = reader.spark.KeyfillDataSource({{"path": {url!r}}})
source.session_cores = 2
rdr = source.streamReader(None)
start = rdr.initialOffset()
rdr.prepareForTriggerAvailableNow()
end = rdr.latestOffset(start, rdr.getDefaultReadLimit())
parts = rdr.partitions(start, end)
report = rdr.reportLatestOffset()
try:
    import pandas
    refused = ""
except ImportError as exc:
    refused = str(exc)
print(json.dumps({{
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("numba", "llvmlite", "pandas")),
    "plan": [start, end, report, pickle.dumps(parts).hex()],
    "refused": refused,
}}))
"""
    runs = {
        kind: json.loads(
            subprocess.run(
                [sys.executable, "-c", script, kind, planning_process.RUNNER],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        for kind in ("runner", "elsewhere")
    }
    assert runs["runner"]["loaded"] == [] and "kept out of Spark's planning process" in runs["runner"]["refused"]
    assert runs["runner"]["plan"] == runs["elsewhere"]["plan"] and runs["runner"]["plan"][3]
    assert runs["elsewhere"]["refused"] == ""  # elsewhere pandas is left alone (a user's process may use it)


@pytest.mark.parametrize("cores", [None, 1, 3, 1000])
def test_by_default_a_batch_has_a_partition_per_core(archive, cores, monkeypatch):
    """Without numPartitions: the session's cores (never more than the groups), a multiple
    of them when the batch holds over TASK_BYTES a core; one per group without the
    session's cores."""
    url, _ = archive
    opts = reader.spark.Options.parse({"path": url}, session_cores=cores)
    planner = reader.spark.enumerator.ArchivePlanner(opts)
    groups = sum(1 for b in planner.manifest.group_file_bytes if b)
    total = sum(planner.manifest.group_file_bytes)
    assert len(planner.plan(0, planner.manifest.slices)) == (groups if cores is None else min(cores, groups))
    task = max(1, total // 5)
    monkeypatch.setattr("reader.spark.enumerator.TASK_BYTES", task)  # the batch is 5 TASK_BYTES or more
    if cores is not None:
        waves = -(-total // (cores * task))
        assert planner.partitions_for(total, groups) == cores * waves
        assert len(planner.plan(0, planner.manifest.slices)) == min(groups, cores * waves)
    else:
        assert len(planner.plan(0, planner.manifest.slices)) == groups


@pytest.mark.parametrize("fmt", ["spark", "csv", "json"])
def test_handoff_names_the_next_offset_after_the_archive_for_every_partition(archive, capsys, fmt):
    from keyfill.cli import main

    url, src = archive
    parts = src.column("partition").to_numpy()
    offs = src.column("offset").to_numpy()
    expected = {int(p): int(offs[parts == p].max()) + 1 for p in np.unique(parts)}
    assert main(["handoff", url, "--format", fmt]) == 0
    out = capsys.readouterr().out
    if fmt == "spark":
        assert json.loads(out) == {"payments": {str(p): o for p, o in expected.items()}}
    elif fmt == "csv":
        rows = [line.split(",") for line in out.splitlines()]
        assert {int(p): int(o) for t, p, o in rows} == expected and {t for t, _, _ in rows} == {"payments"}
    else:
        doc = json.loads(out)
        assert {int(p): o for p, o in doc["offsets"].items()} == expected
        assert doc["records"] == src.num_rows
        assert json.loads(doc["spark_starting_offsets"]) == {"payments": {str(p): o for p, o in expected.items()}}


def assert_closed_windows(spark, windows_dir: str, src: pa.Table, minimum: int) -> None:
    """The fraud job's Parquet windows equal per-user counts and sums computed straight from
    `src`, for every 1-minute window the final watermark (10 s delay) has closed."""
    payments = [json.loads(v) for v in src.column("value").to_pylist()]
    ts = src.column("timestamp").cast(pa.int64()).to_numpy()
    closed_before = int(ts.max()) - 10_000  # the final watermark: windows ending by then are written
    expected: dict = defaultdict(lambda: [0, 0.0])
    for p, t in zip(payments, ts.tolist()):
        start = t - t % 60_000
        if p["user"] is not None and start + 60_000 <= closed_before:
            expected[(start, p["user"])][0] += 1
            expected[(start, p["user"])][1] += p["amount"]
    got = {
        (int(r["window_start"].timestamp() * 1000), r["user"]): (r["payments"], r["spend"])
        for r in spark.read.parquet(windows_dir).collect()
    }
    assert len(got) > minimum
    assert set(got) == set(expected)
    for k, (n, spend) in expected.items():
        assert got[k][0] == n and got[k][1] == pytest.approx(round(spend, 2), abs=0.011)


def test_the_fraud_backfill_example_writes_every_closed_window_exactly(spark, archive, tmp_path):
    """jobs/fraud_backfill.py end to end: its Parquet windows equal per-user counts and sums
    computed straight from the source, for every window the final watermark has closed."""
    fraud_backfill_writes_every_closed_window(spark, archive, str(tmp_path))


@CONNECT
def test_the_fraud_backfill_example_over_spark_connect_writes_every_closed_window(connect, archive, tmp_path):
    connect.run(fraud_backfill_writes_every_closed_window, archive, str(tmp_path))


def fraud_backfill_writes_every_closed_window(spark, archive, work: str) -> None:
    import argparse

    from jobs.fraud_backfill import job

    url, src = archive
    args = argparse.Namespace(
        archive=url,
        out=f"{work}/fraud",
        window="1 minute",
        watermark_delay="10 seconds",
        max_slices_per_trigger=3,
        max_bytes_per_trigger=None,
        top=3,
        overwrite=True,
    )
    result = job(spark, args)
    assert result["dropped_late"] == 0 and result["records"] == src.num_rows
    assert_closed_windows(spark, result["windows_dir"], src, minimum=100)
    assert open(result["handoff_csv"]).read().count("\n") == len(np.unique(src.column("partition").to_numpy()))


def test_a_checkpoint_of_another_archive_is_refused_naming_both(spark, archive, tmp_path):
    """Offsets carry the archive's fingerprint: a query restarted after its archive was
    recompacted differently fails clearly instead of reading other slices."""
    url, _ = archive
    local, copy = open_storage(url), open_storage(str(tmp_path / "copy"))
    for info in local.list(""):
        copy.write(info.key, local.read(info.key))
    ck = str(tmp_path / "ck")
    (
        stream(spark, copy.url, maxSlicesPerTrigger="2")
        .writeStream.format("noop")
        .option("checkpointLocation", ck)
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    doc = compacted.load_manifest(copy).to_json()  # a recompaction, committed as the next version
    doc["version"], doc["archive"] = doc["version"] + 1, "f" * 16
    copy.create(compacted.version_key(doc["version"]), compacted.dumps(doc))
    with pytest.raises(Exception, match="checkpoint holds offsets of archive"):
        (
            stream(spark, copy.url, maxSlicesPerTrigger="2")
            .writeStream.format("noop")
            .option("checkpointLocation", ck)
            .trigger(availableNow=True)
            .start()
            .awaitTermination()
        )
    rdr = reader.spark.KeyfillStreamReader(reader.spark.Options.parse({"path": url}))
    with pytest.raises(reader.spark.ArchiveChanged):
        rdr.partitions({"slice": 0, "archive": "0" * 16}, rdr.initialOffset())


def test_a_running_query_picks_up_appends_exactly_once(spark, tmp_path):
    """A query with a processing-time trigger follows the archive: two appends committed
    while it runs arrive in later micro-batches, and its sink holds every record of the
    grown source below the final hand-off exactly once."""
    from test_append import copy_share

    from compactor.sources.envelope import build_index

    reader.spark.register(spark)
    full, src, dest = str(tmp_path / "full"), str(tmp_path / "src"), str(tmp_path / "c")
    generate(
        GeneratorConfig(out=full, records=9_000, keys=200, partitions=3, chunk_records=500, rate=100.0, seed=4),
        progress=False,
    )
    assert min(len(v) for v in build_index(open_storage(full)).chunks.values()) >= 3  # each share adds chunks
    copy_share(full, src, 1 / 3)
    compact(CompactConfig(source=src, dest=dest, groups=4, slice_duration="10s"), spark)
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    q = (
        stream(spark, dest)
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", ck)
        .trigger(processingTime="1 second")
        .start()
    )

    def caught_up(version: int) -> int:
        """Wait until the sink holds everything `version` published; its row count."""
        want = compacted.load_manifest(open_storage(dest), version).totals.records
        deadline = time.time() + 180
        while time.time() < deadline:
            q.processAllAvailable()
            got = spark.read.parquet(out).count() if os.path.exists(out) else 0
            if got >= want:
                return got
            time.sleep(0.5)
        raise AssertionError(f"the query did not reach version {version} ({want} records)")

    try:
        assert caught_up(1) == compacted.load_manifest(open_storage(dest), 1).totals.records
        for share, version in ((2 / 3, 2), (1.0, 3)):
            copy_share(full, src, share)
            r = compact(CompactConfig(source=src, dest=dest, append=True, seal_all=share == 1.0), spark)
            assert r.version == version
            caught_up(version)
        batches = q.lastProgress["batchId"]
    finally:
        q.stop()
    assert batches >= 2  # the appends came in later micro-batches
    assert identity(spark.read.parquet(out).toArrow()) == identity(source_table(src))


def test_a_running_query_refuses_an_archive_replaced_under_it(archive, tmp_path):
    """The planner moves to a newer version on each trigger; one of another archive (an
    overwrite with other groups or slices) fails the query instead of mixing the two."""
    url, _ = archive
    local, copy = open_storage(url), open_storage(str(tmp_path / "copy"))
    for info in local.list(""):
        copy.write(info.key, local.read(info.key))
    rdr = reader.spark.KeyfillStreamReader(reader.spark.Options.parse({"path": copy.url}))
    start = rdr.initialOffset()
    assert start["version"] == 1 and rdr.latestOffset(start, ReadAllAvailable())["slice"] > 0
    doc = compacted.load_manifest(copy).to_json()
    doc["version"], doc["archive"] = 2, "f" * 16
    copy.create(compacted.version_key(2), compacted.dumps(doc))
    with pytest.raises(reader.spark.ArchiveChanged, match="recompacted since"):
        rdr.latestOffset(start, ReadAllAvailable())


@hypothesis_settings(100)
@given(st.lists(st.tuples(st.sampled_from(["orders", "", "ü"]), st.integers(0, 3), st.integers(0, 5000)), max_size=30))
def test_constant_columns_are_the_value_on_every_row(asks):
    """A task's constant columns (topic, timestampType, group) are zero-copy slices of one
    array per value, grown as batches get longer: each is the value, exactly n times."""
    constants = reader.spark.rows.Constants()
    for topic, group, n in asks:
        got = constants.column(topic, pa.string(), n), constants.column(group, pa.int32(), n)
        assert got[0].equals(pa.repeat(pa.scalar(topic, pa.string()), n))
        assert got[1].equals(pa.repeat(pa.scalar(group, pa.int32()), n))
