"""What differs between a classic Spark session and a Spark Connect one, asked once here for
every package that runs Spark: which kind a session is, how many tasks it runs at once,
where it runs, its log level.

A Connect session (Spark 4's connect mode: `SPARK_REMOTE`, `spark.api.mode=connect`,
Databricks serverless and shared clusters, any `sc://` client) is a gRPC client: no
SparkContext, no RDDs, no JVM in this process. What keyfill asked of the SparkContext is
asked through the DataFrame API or the session here, with one answer for both kinds.
"""

from __future__ import annotations

from typing import Any

_cores: dict[str, int] = {}  # a Connect session's cores, by session id: asking costs a job


def is_connect(spark: Any) -> bool:
    """A Spark Connect session (pyspark.sql.connect.session.SparkSession), told apart by its
    type's module: importing the class needs the Connect client's packages (grpcio), which a
    classic installation may lack."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def cores(spark: Any) -> int:
    """Tasks the session runs at once: the SparkContext's default parallelism. A Connect
    session has none to ask, so one small job counts the partitions of a range Spark splits
    by default, which it splits by the same number (`spark.sql.leafNodeDefaultParallelism`,
    else the default parallelism); once per session."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    key = str(spark.session_id)
    if key not in _cores:
        # The partition id is nondeterministic, which an aggregate refuses: selected first.
        row = spark.range(0, 1 << 20).selectExpr("spark_partition_id() AS p").agg({"p": "max"}).collect()[0]
        _cores[key] = int(row[0]) + 1
    return _cores[key]


def to_arrow(frame: Any) -> Any:
    """A DataFrame's rows as one Arrow table, on every supported Spark: `toArrow` where the
    DataFrame has it (Spark 4.0, and every Connect session), else a classic 3.5 DataFrame's
    `_collect_as_arrow`, which its own `toPandas` uses (3.5 has no public call that returns
    Arrow), with the schema Spark gives those batches."""
    to_arrow = getattr(frame, "toArrow", None)
    if to_arrow is not None:
        return to_arrow()
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    return pa.Table.from_batches(frame._collect_as_arrow(), to_arrow_schema(frame.schema))


def master(spark: Any) -> str:
    """Where the session runs, for log lines: its master (a Connect server reports its own)."""
    try:
        return str(spark.conf.get("spark.master", "unknown"))
    except Exception:  # a Connect server that refuses to say
        return "unknown"


def shares_environment(spark: Any) -> bool:
    """The session's tasks run on this machine, in this process's environment: a classic
    session on a local master. A Connect server's executors have the server's environment,
    wherever it runs."""
    return not is_connect(spark) and master(spark).startswith("local")


def set_log_level(spark: Any, level: str) -> None:
    """The driver's log level. A Connect server owns its log configuration: only a server
    this process started (`remote("local[*]")`, which runs a SparkContext here) is set."""
    if not is_connect(spark):
        spark.sparkContext.setLogLevel(level)
        return
    from pyspark import SparkContext

    local = SparkContext._active_spark_context
    if local is not None:
        local.setLogLevel(level)


def progress(query: Any) -> list[dict[str, Any]]:
    """A streaming query's recent progress reports as plain dicts, read from each report's
    JSON, with `numInputRows` (the sum over its sources): on a Connect session a report, and
    its JSON, lack the fields Spark computes (`p["numInputRows"]` raises KeyError)."""
    return [_plain(p) for p in query.recentProgress]


def last_progress(query: Any) -> dict[str, Any]:
    """The query's last progress report as a plain dict ({} before the first)."""
    last = query.lastProgress
    return {} if last is None else _plain(last)


def _plain(report: Any) -> dict[str, Any]:
    import json

    text = getattr(report, "json", None)
    plain = dict(json.loads(text)) if isinstance(text, str) else dict(report)
    plain.setdefault("numInputRows", sum(int(s.get("numInputRows") or 0) for s in plain.get("sources") or []))
    return plain
