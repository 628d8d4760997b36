"""`format("keyfill")`: the replay as a Spark source, through PySpark's Python Data Source API.

    import reader.spark
    reader.spark.register(spark)
    stream = spark.readStream.format("keyfill").load("s3://bucket/compacted")

Its roles apart, as Flink's FLIP-27 splits a source: `source` (the data source, its batch and
stream readers, `register`), `enumerator` (the archive's slices admitted to a micro-batch and
bundled into input partitions, the splits), `live` (the topic after the archive),
`admission` (how much a micro-batch takes), `split_reader` (a task's rows), `rows` (the
schema and columns handed to Spark), `options`, `pushdown` (filters), `api` (what the
running PySpark offers), `planning_process` (the process Spark plans a query in). Names are
imported on first use, so that importing a submodule loads no more than it needs.
"""

from keygroups.lazy_names import names_from

_PUBLIC = {
    name: "reader.spark.source"
    for name in (
        "register",
        "KeyfillDataSource",
        "KeyfillBatchReader",
        "KeyfillPushdownReader",
        "KeyfillStreamReader",
        "Options",
        "DataSourceOptionError",
        "ArchiveChanged",
        "DEFAULT_MAX_BYTES_PER_TRIGGER",
        "NAME",
        "PUSHDOWN_CONF",
    )
}

__getattr__ = names_from(globals(), _PUBLIC)

__all__ = list(_PUBLIC)
