"""The hand-written Spark SQL compaction keyfill is measured against (bench/bench_peer.py):
Spark's own Avro reader and writer, groups by `pmod(xxhash64(key), G)`, fixed time slices,
a repartition by group, a sort within partitions, files partitioned by group.

    python -m bench.peer_job SOURCE OUT --groups 64 --slice-duration 10m   # in its own local[2] session
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time

AVRO = "org.apache.spark.sql.avro.AvroFileFormat"  # by class name: pyspark's jars hold it, without the alias


def peer(spark, src: str, out: str, groups: int, slice_duration: str) -> float:
    """Seconds from the read's planning to the last file written."""
    from pyspark.sql import functions as F

    from keygroups.durations import parse_duration

    ms = parse_duration(slice_duration)
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    (
        spark.read.format(AVRO)
        .load(src)
        .withColumn("grp", F.pmod(F.xxhash64("key"), F.lit(groups)))
        .withColumn("slice", F.floor(F.col("timestamp").cast("long") / ms))
        .repartition(groups, "grp")
        .sortWithinPartitions("slice", "partition", "offset")
        .write.format(AVRO)
        .partitionBy("grp")
        .save(out)
    )
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source")
    ap.add_argument("out")
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--slice-duration", default="10m")
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()
    from compactor.spark_session import local_spark

    spark = local_spark(args.master, app="peer compaction", progress=False)
    spark.sparkContext.setLogLevel("ERROR")
    print(f"{peer(spark, args.source, args.out, args.groups, args.slice_duration):.1f} s")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
