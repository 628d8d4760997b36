"""Filters pushed to a batch read of `format("keyfill")` (reader/spark/pushdown.py), on a real
local[2] Spark with spark.sql.python.filterPushdown.enabled: a filtered read returns exactly
what the whole read filtered afterwards returns, the source itself drops what the filters on
its own columns exclude (fewer pieces planned, fewer rows handed to Spark), the live ranges
of a batch read with kafka.* options too, and without the setting the source reads as before."""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.errors import AnalysisException
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    Not,
)
from test_kafka_live import archived, as_records, produce
from test_reader import hypothesis_settings
from test_spark_source import archive, identity  # noqa: F401 (archive: the module's fixture)

import reader.spark
import reader.spark.rows
from keyfill.synth.topic import Record, TopicArchive
from keygroups import compacted
from keygroups.storage import open_storage
from reader.spark import PUSHDOWN_CONF, DataSourceOptionError, KeyfillBatchReader, KeyfillPushdownReader, Options

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
OPS = {  # SQL, the filter Spark pushes, the pyarrow expression
    "=": (EqualTo, lambda c, v: c == v),
    "<": (LessThan, lambda c, v: c < v),
    "<=": (LessThanOrEqual, lambda c, v: c <= v),
    ">": (GreaterThan, lambda c, v: c > v),
    ">=": (GreaterThanOrEqual, lambda c, v: c >= v),
}


@contextmanager
def filter_pushdown(spark, on: bool, registered: bool | None = None):
    """The session with the setting `on`, keyfill registered while it was `registered`
    (default: the same); afterwards off, keyfill registered again."""
    registered = on if registered is None else registered
    spark.conf.set(PUSHDOWN_CONF, str(registered).lower())
    reader.spark.register(spark, filter_pushdown=registered)
    spark.conf.set(PUSHDOWN_CONF, str(on).lower())
    try:
        yield spark
    finally:
        spark.conf.set(PUSHDOWN_CONF, "false")
        reader.spark.register(spark)


@pytest.fixture(scope="module")
def whole(spark, archive):  # noqa: F811
    """The whole archive as the source reads it, with its topic and the range of its times."""
    url, _ = archive
    table = spark.read.format("keyfill").option("includeHeaders", "true").load(url).toArrow()
    return url, table


def conjunct(column: str, op: str, value, topic: str):
    """(SQL, the filter Spark pushes or None when it pushes none, pyarrow expression)."""
    field = pc.field(column)
    if column == "timestamp":
        us = (value - EPOCH) // timedelta(microseconds=1)
        sql_value, arrow_value = f"timestamp_micros({us})", pa.scalar(value, pa.timestamp("us", tz="UTC"))
    elif column == "topic":
        sql_value, arrow_value = f"'{value}'", value
    else:
        sql_value, arrow_value = str(value), value
    if op in ("IN", "NOT IN"):
        listed = ", ".join(f"'{v}'" if isinstance(v, str) else str(v) for v in value)
        f, expr = In((column,), list(value)), field.isin(list(value))
        if op == "NOT IN":
            f, expr = Not(f), ~expr
        return f"{column} {op} ({listed})", f, expr
    if op == "<>":
        return f"{column} <> {sql_value}", Not(EqualTo((column,), value)), ~(field == arrow_value)
    kind, build = OPS[op]
    return f"{column} {op} {sql_value}", kind((column,), value), build(field, arrow_value)


@st.composite
def conjuncts(draw, topic: str, first: datetime, last: datetime):
    """A filter on one of the source's columns, as a query would write it."""
    column = draw(st.sampled_from(["partition", "key_group", "slice", "timestamp", "topic", "offset", "key"]))
    if column == "key":
        return "key IS NOT NULL", IsNotNull(("key",)), pc.field("key").is_valid()
    if column == "topic":
        op = draw(st.sampled_from(["=", "<>", "IN"]))
        value = draw(st.sampled_from([topic, "other"]))
        return conjunct(column, op, [value, "x"] if op == "IN" else value, topic)
    if column == "timestamp":  # one of 16 steps over the archive's times, or just outside them
        at = first + (last - first) * draw(st.integers(-1, 17)) / 16
        at += timedelta(microseconds=draw(st.sampled_from([0, 1, 999])))
        return conjunct(column, draw(st.sampled_from(list(OPS))), at, topic)
    top = {"partition": 3, "key_group": 6, "slice": 12, "offset": 8_000}[column]
    op = draw(st.sampled_from([*OPS, "<>", "IN", "NOT IN"] if column != "offset" else list(OPS)))
    if op in ("IN", "NOT IN"):
        return conjunct(column, op, sorted(draw(st.sets(st.integers(0, top), min_size=2, max_size=3))), topic)
    return conjunct(column, op, draw(st.integers(-1, top + 1)), topic)


EXACT = ("partition", "key_group", "slice", "topic")


def scan_rows(df) -> int:
    """The rows the keyfill scan of an executed query handed to Spark (its SQL metric; 0
    when Spark found the filter always false and planned no scan)."""
    leaves = df._jdf.queryExecution().executedPlan().collectLeaves()
    scans = [leaves.apply(i) for i in range(leaves.size()) if "BatchScan" in leaves.apply(i).nodeName()]
    assert len(scans) <= 1
    return sum(s.metrics().apply("numOutputRows").value() for s in scans)


def drawn_filters(data, table: pa.Table) -> list[tuple[str, object, pc.Expression]]:
    """One to three conjuncts, now and then with a disjunction Spark pushes nothing of."""
    topic = table.column("topic")[0].as_py()
    ts = table.column("timestamp")
    drawn = data.draw(st.lists(conjuncts(topic, pc.min(ts).as_py(), pc.max(ts).as_py()), min_size=1, max_size=3))
    if data.draw(st.booleans()):
        drawn.append(("(partition = 1 OR slice = 3)", None, (pc.field("partition") == 1) | (pc.field("slice") == 3)))
    return drawn


def pieces_of(table: pa.Table) -> int:
    """The pieces that hold these rows (a piece: one group's records of one slice)."""
    return len(set(zip(table.column("key_group").to_pylist(), table.column("slice").to_pylist())))


def exact(sql: str) -> bool:
    return sql.split()[0] in EXACT


@hypothesis_settings(40)
@given(data=st.data())
def test_the_source_keeps_exactly_the_filters_it_applies(whole, data):
    """Without Spark: the filters Spark would push, the reader's answer, its rows filtered by
    what it returned."""
    url, table = whole
    drawn = [d for d in drawn_filters(data, table) if d[1] is not None]
    rest, pieces, rows = planned(url, [f for _, f, _ in drawn])
    assert [id(f) for f in rest] == [id(f) for sql, f, _ in drawn if not exact(sql)]
    got = rows.filter(_all(e for sql, _, e in drawn if not exact(sql)))
    assert identity(got) == identity(table.filter(_all(e for _, _, e in drawn))), drawn
    assert pieces <= pieces_of(table)


@hypothesis_settings(8)
@given(data=st.data())
def test_a_filtered_read_is_the_whole_read_filtered_and_the_source_drops_what_it_can(spark, whole, data):
    url, table = whole
    drawn = drawn_filters(data, table)
    where = " AND ".join(sql for sql, _, _ in drawn)
    with filter_pushdown(spark, True):
        df = spark.read.format("keyfill").option("includeHeaders", "true").load(url).where(where)
        got = df.toArrow()
        read = scan_rows(df)
    expected = table.filter(_all(e for _, _, e in drawn))
    assert identity(got) == identity(expected), where
    # the source applied the filters on its own columns itself, and skipped pieces by time
    # (Spark may infer more pushed filters from a disjunction: then fewer rows still)
    own = table.filter(_all(e for sql, f, e in drawn if f is not None and exact(sql)))
    assert expected.num_rows <= read <= own.num_rows, where
    folded = expected.num_rows == read == 0  # a contradiction Spark's optimizer folds: no scan at all
    if all(f is not None and not sql.startswith("timestamp") for sql, f, _ in drawn) and not folded:
        assert read == own.num_rows, where


def _all(exprs) -> pc.Expression:
    out = pc.scalar(True)
    for e in exprs:
        out = out & e
    return out


def planned(url: str, filters: list, **options: str) -> tuple[list, int, pa.Table]:
    """What a pushdown reader returns to Spark, the pieces it plans and the rows it reads."""
    r = KeyfillPushdownReader(Options.parse({"path": url, "includeHeaders": "true", **options}))
    rest = list(r.pushFilters(filters))
    parts = r.partitions()
    pieces = sum(len(getattr(p, "pieces", ())) for p in parts)
    batches = [b for p in parts for b in r.read(p)]
    return rest, pieces, pa.Table.from_batches(batches, schema=reader.spark.rows.arrow_schema(True))


def test_pieces_of_other_groups_slices_and_times_are_not_planned(whole):
    url, table = whole
    manifest = compacted.load_manifest(open_storage(url))
    everything = pieces_of(table)
    rest, pieces, rows = planned(url, [In(("key_group",), [1, 2]), GreaterThanOrEqual(("slice",), 5)])
    assert rest == []
    held = table.filter(pc.field("key_group").isin([1, 2]) & (pc.field("slice") >= 5))
    assert identity(rows) == identity(held)
    assert pieces == len(set(zip(held.column("key_group").to_pylist(), held.column("slice").to_pylist())))
    assert pieces < everything
    rest, pieces, rows = planned(url, [EqualTo(("partition",), 1)])  # a row filter: every piece is read
    assert rest == [] and pieces == everything
    assert identity(rows) == identity(table.filter(pc.field("partition") == 1))
    # times: pieces whose records all lie on the other side are skipped, the filter stays Spark's
    ts = table.column("timestamp")
    middle = pc.min(ts).as_py() + (pc.max(ts).as_py() - pc.min(ts).as_py()) / 2
    for f, expr in [
        (GreaterThanOrEqual(("timestamp",), middle), pc.field("timestamp") >= middle),
        (LessThan(("timestamp",), middle), pc.field("timestamp") < middle),
    ]:
        rest, pieces, rows = planned(url, [f])
        assert rest == [f] and pieces < everything
        assert identity(rows.filter(expr)) == identity(table.filter(expr))
    # a late record's timestamp lies below its slice's start: an upper bound skips no slice
    # by the slice's bounds, only pieces whose least timestamp is past it
    d, base = manifest.slice_duration_ms, manifest.base
    start_of = (pc.cast(table.column("slice"), pa.int64()).to_numpy() + base) * d
    late = (pc.cast(ts, pa.int64()).to_numpy() // 1000) < start_of
    assert late.any()  # the archive's jitter puts records below their slice's start
    s = int(table.column("slice").to_numpy()[late].max())
    before = datetime.fromtimestamp((base + s) * d / 1000, timezone.utc)
    rest, pieces, rows = planned(url, [LessThan(("timestamp",), before)])
    assert s in rows.column("slice").to_pylist()
    expr = pc.field("timestamp") < before
    assert identity(rows.filter(expr)) == identity(table.filter(expr))
    rest, pieces, rows = planned(url, [EqualTo(("topic",), "another")])
    assert (rest, pieces, rows.num_rows) == ([], 0, 0)


def test_without_the_setting_the_source_reads_as_before(spark, whole):
    url, table = whole
    expected = table.filter(pc.field("partition") == 1)
    for on in (False, True):  # registered while off: never the pushdown reader
        with filter_pushdown(spark, on, registered=False):
            df = spark.read.format("keyfill").option("includeHeaders", "true").load(url).where("partition = 1")
            assert identity(df.toArrow()) == identity(expected)
            assert scan_rows(df) == table.num_rows  # Spark filters: the source hands it every row
    # why `register` reads the setting: PySpark refuses a reader with pushFilters while it is off
    with filter_pushdown(spark, False, registered=True):
        with pytest.raises(AnalysisException, match="DATA_SOURCE_PUSHDOWN_DISABLED"):
            spark.read.format("keyfill").load(url).where("partition = 1").count()
    assert isinstance(reader.spark.KeyfillDataSource({"path": url}).reader(None), KeyfillBatchReader)
    with filter_pushdown(spark, True, registered=False):  # opt-in only: the setting alone takes no filters
        df = spark.read.format("keyfill").option("includeHeaders", "true").load(url).where("partition = 1")
        assert identity(df.toArrow()) == identity(expected)
        assert scan_rows(df) == table.num_rows
    with pytest.raises(DataSourceOptionError, match="filterPushdown.enabled"):
        reader.spark.register(spark, filter_pushdown=True)  # the setting is off again here
    # a read with no pieces to plan: PySpark hands read() a partition of its own
    slices = compacted.load_manifest(open_storage(url)).slices
    assert spark.read.format("keyfill").option("startingSlice", slices).load(url).count() == 0


def test_two_loads_self_join_each_side_reads_its_own_rows(spark, whole):
    url, table = whole
    with filter_pushdown(spark, True):
        sides = [spark.read.format("keyfill").load(url).where(f"partition = {p}") for p in (0, 1)]
        for p, side in enumerate(sides):
            rows = side.toArrow().num_rows
            assert scan_rows(side) == rows == table.filter(pc.field("partition") == p).num_rows
        got = sides[0].alias("a").join(sides[1].alias("b"), "key_group").count()
    groups = [Counter(table.filter(pc.field("partition") == p).column("key_group").to_pylist()) for p in (0, 1)]
    assert got == sum(n * groups[1][g] for g, n in groups[0].items())


def test_why_pushdown_is_opt_in_one_loaded_dataframe_scanned_with_two_filters(spark, whole):
    """PySpark 4.3 keeps a pushdown's read plan on the loaded relation's data source, so every
    scan of one DataFrame reads with the last pushdown: a union of two filters of it counts
    one side twice (docs/spark-source.md, Filters). When a PySpark upgrade fixes that, this
    fails: then `filter_pushdown` can be on whenever the setting is."""
    url, table = whole
    with filter_pushdown(spark, True):
        df = spark.read.format("keyfill").load(url)
        both = df.where("partition = 0").union(df.where("partition = 1")).count()
    right = table.filter(pc.field("partition").isin([0, 1])).num_rows
    assert both != right and both == 2 * table.filter(pc.field("partition") == 1).num_rows


def test_a_batch_read_into_the_topic_plans_only_the_live_ranges_the_filters_let_in(keyfill_kafka, tmp_path):
    parts = tuple(tuple(Record(p, i, 1_000 * i, b"k%d" % (i % 5), b"v%d" % i) for i in range(30)) for p in range(3))
    topic = TopicArchive("t", parts, 7)
    name = produce(keyfill_kafka, topic)
    url = archived(topic, [0.5, 0.8, 0.3], tmp_path, groups=2, slice_duration="5s", seal_all=True)
    live = {"kafka.bootstrap.servers": keyfill_kafka.bootstrap, "subscribe": name}
    _, _, table = planned(url, [], **live)
    assert sorted(as_records(table.to_pylist())) == sorted(topic.records)

    def ranges(filters: list) -> list[int]:
        r = KeyfillPushdownReader(Options.parse({"path": url, **live}))
        list(r.pushFilters(filters))
        return sorted(p.partition for p in r.partitions() if hasattr(p, "partition"))

    assert ranges([]) == [0, 1, 2]
    assert ranges([In(("partition",), [1, 2])]) == [1, 2]
    assert ranges([GreaterThanOrEqual(("slice",), 0)]) == []  # live records have no slice
    assert ranges([EqualTo(("topic",), "t")]) == []  # the archive's topic; live rows carry the one read
    for filters, expr in [
        ([In(("partition",), [1, 2])], pc.field("partition").isin([1, 2])),
        ([EqualTo(("key_group",), 1)], pc.field("key_group") == 1),  # live: a row filter on the key's group
        (
            [Not(EqualTo(("partition",), 0)), IsNotNull(("slice",))],
            (pc.field("partition") != 0) & pc.field("slice").is_valid(),
        ),
        ([EqualTo(("topic",), name)], pc.field("topic") == name),
    ]:
        rest, _, got = planned(url, filters, **live)
        assert rest == []
        assert sorted(as_records(got.to_pylist())) == sorted(as_records(table.filter(expr).to_pylist()))
