"""Decode speed of the source formats into Arrow, one thread (records/s per core), measured
in the same run against keyfill's envelope decoder (the baseline: what the statistics and
rewrite passes read today) and against kafka-python's reader (the library a Kafka segment
decoder would otherwise use).

    python -m bench.bench_sources                  # 500K records
    python -m bench.bench_sources --records 2000000

The same records (a key of ~10 bytes, a value of ~100, one header) are written once as an
envelope chunk (snappy) and as Kafka log segments of ~1 MB batches per codec, by
kafka-python's batch builder, offsets assigned as a broker does. The uncompressed segment
is also stored as Aiven's tiered storage stores it with zstd chunk compression. For the Kafka Connect
layout's JsonFormat and ParquetFormat (`--connect-records` of them, the value a struct of the
timestamp and the same ~100 bytes as text), the value, keys and headers files are written as
the connector names and shapes them (json module + gzip, pyarrow.parquet) and decoded by
`compactor.sources.kafka_connect`'s per-format readers.
Redpanda Iceberg Topics tables (4 partitions) are written by pyiceberg and read by
`--format iceberg` with Arrow's and pyiceberg's thread pools held to one thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import tempfile
import time

import numpy as np


def records(n: int, seed: int = 1) -> list[tuple[int, bytes | None, bytes, list]]:
    rng = np.random.default_rng(seed)
    ts = 1_767_225_600_000 + np.cumsum(rng.integers(0, 5, n)) - rng.integers(0, 2_000, n)
    keys = rng.integers(0, 100_000, n)
    sizes = rng.integers(60, 140, n)
    blob = rng.integers(32, 127, int(sizes.sum()), dtype=np.uint8).tobytes()
    out, at = [], 0
    for t, k, s in zip(ts.tolist(), keys.tolist(), sizes.tolist()):
        out.append((t, b"user%d" % k, blob[at : at + s], [("source", b"web")]))
        at += s
    return out


def kafka_segment(recs, codec: int, batch_records: int = 8_000) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    parts = []
    for base in range(0, len(recs), batch_records):
        b = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=codec,
            is_transactional=False,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            batch_size=1 << 30,
        )
        for i, (ts, key, value, headers) in enumerate(recs[base : base + batch_records]):
            b.append(i, timestamp=ts, key=key, value=value, headers=headers)
        buf = bytearray(b.build())
        buf[0:8] = struct.pack(">q", base)
        parts.append(bytes(buf))
    return b"".join(parts)


def tiered_row(segment: bytes, n: int, rounds: int) -> tuple[str, int, float]:
    """The tiered-storage path: the segment stored as the Aiven RemoteStorageManager stores it
    with compression on (4 MiB chunks, its recommended size, each a zstd frame written by
    the `zstandard` package), then de-chunked and decoded; the manifest parsed every round."""
    import base64
    import json

    import zstandard

    from compactor.sources.kafka_segments.record_batches import decode_segment
    from compactor.sources.kafka_segments.tiered import parse_manifest, segment_bytes

    size = 4 << 20
    z = zstandard.ZstdCompressor(write_content_size=True)
    stored = [z.compress(segment[i : i + size]) for i in range(0, len(segment), size)]
    lengths = [len(c) for c in stored]
    k = len(lengths)  # ChunkSizesBinaryCodec, 4 bytes a value above base 0 (the plugin picks the fewest)
    sizes = struct.pack(">ii", 1, *lengths) if k == 1 else struct.pack(f">iib{k - 1}Ii", k, 0, 4, *lengths)
    uuid = "AAAAAAAAAAAAAAAAAAAAAA"
    manifest = json.dumps(
        {
            "version": "1",
            "chunkIndex": {
                "type": "variable",
                "originalChunkSize": size,
                "originalFileSize": len(segment),
                "transformedChunks": base64.b64encode(z.compress(sizes)).decode(),
            },
            "segmentIndexes": {k: {"position": 0, "size": 0} for k in ("offset", "timestamp", "producerSnapshot")}
            | {"leaderEpoch": {"position": 0, "size": 0}, "transaction": None},
            "compression": True,
            "remoteLogSegmentMetadata": {
                "remoteLogSegmentId": {
                    "topicIdPartition": {"topicId": uuid, "topicPartition": {"topic": "t", "partition": 0}},
                    "id": uuid,
                },
                "startOffset": 0,
                "endOffset": n - 1,
                "segmentLeaderEpochs": {"0": 0},
            },
        }
    ).encode()
    obj = b"".join(stored)

    def read() -> int:
        m = parse_manifest(manifest, "m")
        return decode_segment(segment_bytes(obj, m, "s"), 0, name="s").num_rows

    return ("kafka-segments tiered, zstd 4 MiB chunks", len(obj), best_rate(read, n, rounds))


def connect_files(recs) -> dict[str, tuple[bytes, bytes, bytes]]:
    """(values, keys, headers) file bytes per Connect file extension."""
    import gzip
    import io
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    def line(doc) -> bytes:
        return json.dumps(doc, separators=(",", ":")).encode() + b"\n"

    values = [{"ts": t, "v": v.decode()} for t, _, v, _ in recs]
    keys = [k.decode() for _, k, _, _ in recs]
    headers = [[{"key": hk, "value": hv.decode()} for hk, hv in h] for *_, h in recs]
    plain = (
        b"".join(map(line, values)),
        b"".join(map(line, keys)),
        b"".join(line({"headers": h}) for h in headers),
    )

    def parquet(table: pa.Table) -> bytes:
        out = io.BytesIO()
        pq.write_table(table, out, compression="snappy")
        return out.getvalue()

    ts = pa.array([t for t, *_ in recs], pa.timestamp("ms", tz="UTC"))
    return {
        ".json": plain,
        ".json.gz": tuple(gzip.compress(b) for b in plain),
        ".snappy.parquet": (
            parquet(pa.table({"ts": ts, "v": [v["v"] for v in values]})),
            parquet(pa.table({"key": keys})),
            parquet(pa.table({"headers": headers})),
        ),
    }


def connect_decode(ext: str, files: tuple[bytes, bytes, bytes]) -> int:
    from compactor.sources.kafka_connect.file_formats import EXTENSIONS
    from compactor.sources.kafka_connect.records import timestamps_ms

    fmt = EXTENSIONS[ext]
    v = fmt.values(files[0], "v", 0, "ts", None)
    timestamps_ms(v, "v", 0, "ts")
    keys, headers = fmt.keys(files[1], "k", 0), fmt.headers(files[2], "h", 0)
    assert len(keys) == len(headers) == len(v)
    return len(v)


def iceberg_tables(recs, root: str, partitions: int = 4) -> dict[str, str]:
    """The records as Redpanda Iceberg Topics tables written by pyiceberg (SQLite catalog),
    spread round-robin over `partitions`: one table appended a partition at a time in
    offset order (as Redpanda writes, a file per partition), one with every row shuffled
    over 4 files. Returns label -> metadata file."""
    import random

    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    from tests.records import redpanda_rows, redpanda_schema

    schema = redpanda_schema()
    by_partition: dict[int, list] = {p: [] for p in range(partitions)}
    for i, (ts, key, value, h) in enumerate(recs):  # every record has a header: no empty lists
        by_partition[i % partitions].append((i // partitions, ts * 1000, key, value, h))
    rows = redpanda_rows(by_partition)
    rows.sort(key=lambda r: (r["redpanda"]["offset"], r["redpanda"]["partition"]))  # record order, as shuffled
    cat = SqlCatalog("default", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")
    cat.create_namespace("redpanda")
    out = {}
    for label, shuffled in (("file per partition", False), ("shuffled, 4 files", True)):
        table = cat.create_table(f"redpanda.t{len(out)}", schema)
        arrow = table.schema().as_arrow()
        if shuffled:
            random.Random(1).shuffle(rows)
            parts = [rows[i::4] for i in range(4)]
        else:
            parts = [[r for r in rows if r["redpanda"]["partition"] == p] for p in range(partitions)]
            for part in parts:
                part.sort(key=lambda r: r["redpanda"]["offset"])
        for part in parts:
            table.append(pa.Table.from_pylist(part, schema=arrow))
        out[label] = cat.load_table(f"redpanda.t{len(out)}").metadata_location
    return out


def iceberg_rate(metadata: str, n: int, rounds: int) -> tuple[int, float]:
    """Records/s of reading every chunk (listing excluded: the driver does it once), with
    Arrow's and pyiceberg's thread pools held to one thread."""
    import pyarrow as pa

    from compactor.sources.iceberg import IcebergSource

    cpu, io = pa.cpu_count(), pa.io_thread_count()
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    try:
        source = IcebergSource(metadata, threads=1)
        chunks = source.list_chunks()
        files = sum(t.file.file_size_in_bytes for t in source._tasks)
        return files, best_rate(lambda: sum(source.read(c).num_rows for c in chunks), n, rounds)
    finally:
        pa.set_cpu_count(cpu)
        pa.set_io_thread_count(io)


def best_rate(fn, n: int, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        got = fn()
        times.append(time.perf_counter() - t)
        assert got == n, (got, n)
    return n / statistics.median(times)


def main() -> None:
    os.environ.setdefault("PYICEBERG_MAX_WORKERS", "1")  # pyiceberg's executor: one thread, like the other rows
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--library-records", type=int, default=100_000, help="records kafka-python's reader decodes")
    ap.add_argument("--connect-records", type=int, default=200_000, help="records of the Kafka Connect rows")
    args = ap.parse_args()

    from kafka.record.memory_records import MemoryRecords

    from compactor.sources.kafka_segments.record_batches import decode_segment
    from keygroups import envelope

    recs = records(args.records)
    batch = envelope.batch_from_records(
        [
            {
                "partition": 0,
                "offset": i,
                "timestamp": t,
                "key": k,
                "value": v,
                "headers": [{"key": hk, "value": hv} for hk, hv in h],
            }
            for i, (t, k, v, h) in enumerate(recs)
        ]
    )
    avro = envelope.encode_avro(batch, codec="snappy")
    n = args.records
    rows = [
        (
            "envelope Avro, snappy (baseline)",
            len(avro),
            best_rate(lambda: envelope.decode_avro(avro)[1].num_rows, n, args.rounds),
        )
    ]
    segments = {}
    for name, codec in (("none", 0), ("gzip", 1), ("snappy", 2), ("lz4", 3), ("zstd", 4)):
        seg = segments[name] = kafka_segment(recs, codec)
        decode_segment(seg, 0, name=name)  # warm: compile once
        rows.append(
            (
                f"kafka-segments, {name}",
                len(seg),
                best_rate(lambda seg=seg: decode_segment(seg, 0, name="s").num_rows, n, args.rounds),
            )
        )
    rows.append(tiered_row(segments["none"], n, args.rounds))
    m = min(args.library_records, n)
    lib_seg = kafka_segment(recs[:m], 3)

    def library() -> int:
        count, mr = 0, MemoryRecords(lib_seg)
        while mr.has_next():
            for r in mr.next_batch():
                count += r.offset >= 0 and len(r.headers) >= 0  # touch what a decoder must produce
        return count

    rows.append(("kafka-python reader, lz4 (library)", len(lib_seg), best_rate(library, m, 1)))
    c = min(args.connect_records, n)
    for ext, files in connect_files(recs[:c]).items():
        rows.append(
            (
                f"connect {ext} +keys+headers",
                sum(map(len, files)),
                best_rate(lambda ext=ext, files=files: connect_decode(ext, files), c, args.rounds),
            )
        )
    with tempfile.TemporaryDirectory() as root:
        for label, metadata in iceberg_tables(recs, root).items():
            size, rate = iceberg_rate(metadata, n, args.rounds)
            rows.append((f"iceberg (Redpanda), {label}", size, rate))
    base = rows[0][2]
    print(f"\n{n:,} records (key ~10 B, value ~100 B, 1 header), one thread, median of {args.rounds} rounds")
    print(f"{'decoder':<40} {'MB':>8} {'records/s':>12} {'vs envelope':>12}")
    for label, size, rate in rows:
        print(f"{label:<40} {size / 1e6:>8.1f} {rate / 1e6:>10.2f}M {rate / base:>11.2f}x")


if __name__ == "__main__":
    main()
