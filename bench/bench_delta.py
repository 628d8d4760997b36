"""Compaction from a bronze Delta table against the same records as Kafka Connect Avro files,
as a user times it: `keyfill compact` whole commands, one run each, alternating.

    python -m bench.bench_delta                    # 2M records (sources written once, cached)
    python -m bench.bench_delta --records 500000   # a quick look

The records: `keyfill generate`'s payments topic (8 partitions, 20K keys, headers, snappy).
The Kafka Connect copy: the S3 sink's layout, Avro values, 50,000 records a file. The Delta
copy: the columns Spark's Kafka source gives, written by delta-rs as a streaming job would,
in commits of 250,000 rows in event-time order (every file holds rows of every partition),
partitioned by ingestion date, with an OPTIMIZE after half of them. Both are compacted with
`--groups 64 --slice-duration 10m --seal-all --master local[2]` (Spark's own Delta reader
needs JVM jars from a registry this project cannot reach: delta-rs is the reader here).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc

from bench.archives import cached_source

COMMIT_ROWS = 250_000
COMMON = ["--groups", "64", "--slice-duration", "10m", "--seal-all", "--overwrite", "--master", "local[2]"]


def envelope_source(root: str, records: int) -> str:
    from keyfill.synth.generate import GeneratorConfig

    return cached_source(
        GeneratorConfig(
            out=os.path.join(root, f"source-{records}"),
            records=records,
            keys=20_000,
            partitions=8,
            chunk_records=max(1, records // 80),
            headers=True,
            rate=1_000.0,
            codec="snappy",
            seed=11,
        )
    )


def all_records(src: str) -> pa.Table:
    from compactor.sources import open_source

    source = open_source(src)
    return pa.Table.from_batches([source.read(c) for c in source.list_chunks()])


def connect_copy(root: str, src: str) -> str:
    from compactor.sources import open_source
    from keyfill.synth.kafka_connect import write_connect_archive

    dest = os.path.join(root, "connect")
    if not os.path.exists(os.path.join(dest, "done")):
        shutil.rmtree(dest, ignore_errors=True)
        write_connect_archive(open_source(src), dest, records_per_file=50_000, codec="snappy")
        open(os.path.join(dest, "done"), "w").close()
    return dest


def delta_copy(root: str, table: pa.Table) -> str:
    from deltalake import DeltaTable, write_deltalake

    dest = os.path.join(root, "bronze", "payments")
    if os.path.exists(os.path.join(root, "bronze-done")):
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    table = table.sort_by([("timestamp", "ascending")])
    ts = table.column("timestamp")
    day = pc.strftime(ts, format="%Y-%m-%d")
    bronze = pa.table(
        {
            "key": table.column("key"),
            "value": table.column("value"),
            "topic": pa.array(["payments"] * table.num_rows),
            "partition": table.column("partition"),
            "offset": table.column("offset"),
            "timestamp": ts.cast(pa.timestamp("us", tz="UTC")),
            "timestampType": pa.array([0] * table.num_rows, pa.int32()),
            "headers": table.column("headers"),
            "date": day,
        }
    )
    commits = range(0, bronze.num_rows, COMMIT_ROWS)
    for i, at in enumerate(commits):
        write_deltalake(dest, bronze.slice(at, COMMIT_ROWS), mode="append", partition_by=["date"])
        if i == len(commits) // 2:
            DeltaTable(dest).optimize.compact()
    open(os.path.join(root, "bronze-done"), "w").close()
    return dest


def whole(argv: list[str]) -> float:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    t = time.perf_counter()
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def records_in(url: str) -> int:
    from keygroups import compacted
    from keygroups.storage import open_storage

    return compacted.load_manifest(open_storage(url)).totals.records


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--dir", default="/tmp/keyfill-bench-delta")
    args = ap.parse_args()
    root = os.path.join(args.dir, str(args.records))
    os.makedirs(root, exist_ok=True)
    src = envelope_source(root, args.records)
    connect = connect_copy(root, src)
    delta = delta_copy(root, all_records(src))
    from deltalake import DeltaTable

    files = len(DeltaTable(delta).file_uris())
    keyfill = os.path.join(os.path.dirname(sys.executable), "keyfill")
    runs = {
        "kafka-connect": [keyfill, "compact", connect, os.path.join(root, "out-connect"), "--format", "kafka-connect"]
        + ["--timestamp-field", "ts", *COMMON],
        "delta": [keyfill, "compact", delta, os.path.join(root, "out-delta"), "--format", "delta", *COMMON],
    }
    whole(runs["kafka-connect"][:2] + ["--help"])  # the console script's imports warm in the page cache
    seconds = {name: whole(argv) for name, argv in runs.items()}  # one run each, Connect first
    counts = {name: records_in(argv[3]) for name, argv in runs.items()}
    if len(set(counts.values())) != 1 or counts["delta"] != args.records:
        raise SystemExit(f"the archives differ: {counts} records, {args.records:,} generated")
    base = seconds["kafka-connect"]
    print(f"\n{args.records:,} records, 8 partitions, Delta: {files} data files; keyfill compact, local[2], one run")
    print(f"{'source':<16}{'seconds':>9}{'ratio':>8}")
    for name, s in seconds.items():
        print(f"{name:<16}{s:>9.1f}{s / base:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
