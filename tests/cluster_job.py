"""Submitted by tests/test_cluster.py with `spark-submit --py-files keyfill-*.whl`: the
compaction job (the script `keyfill jobs compact` names, its `main` called with the options
given), then the audit in Spark (`verify_spark`) and the `format("keyfill")` source, batch
and streaming, on executors apart from this driver: one application, so the executors start
once. Prints the compaction's result, then one JSON line."""

from __future__ import annotations

import json
import runpy
import sys


def main(compact_script: str, source_url: str, dest_url: str, *compact_options: str) -> None:
    from pyspark.sql import SparkSession

    from compactor.sources import open_source
    from compactor.verify.spark import verify_spark
    from keygroups.storage import open_storage
    from reader.spark import register

    spark = SparkSession.builder.appName("keyfill cluster test").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)  # also ships the wheel to the executors (keygroups.executor_code)
    try:
        compact_job = runpy.run_path(compact_script)  # as a module, not __main__: its main() is called
        assert compact_job["main"]([source_url, dest_url, *compact_options]) == 0
        report = verify_spark(open_source(source_url), open_storage(dest_url), spark)
        rows = spark.read.format("keyfill").load(dest_url)
        batch = rows.groupBy().agg({"offset": "sum", "*": "count"}).collect()[0]
        # streaming: the driver plans in a Python worker of its own, which must find keyfill too
        query = (
            spark.readStream.format("keyfill")
            .option("maxSlicesPerTrigger", "3")
            .load(dest_url)
            .writeStream.format("memory")
            .queryName("replayed")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        streamed = spark.sql("select count(*) as n, sum(offset) as s from replayed").collect()[0]
        triggers = len(query.recentProgress)
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # without the driver
    finally:
        spark.stop()
    out = {
        "verified": report.ok,
        "violations": str(report.violations)[:2000],
        "records": batch["count(1)"],
        "offset_sum": batch["sum(offset)"],
        "executors": executors,
        "streamed_records": streamed["n"],
        "streamed_offset_sum": streamed["s"],
        "triggers": triggers,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:])
