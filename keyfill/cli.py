"""The `keyfill` command: one entry point, a subcommand per job.

Each subcommand imports its package only when it runs, so
`keyfill generate` never starts Spark.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime, timezone


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction in [0, 1]")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _iso_ms(text: str) -> int:
    """An ISO 8601 time (UTC unless it says otherwise) as epoch milliseconds."""
    try:
        start = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time like 2026-01-01T00:00:00Z") from None
    if start.tzinfo is None:
        start = start.replace(tzinfo=timezone.utc)
    return int(start.timestamp() * 1000)


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


# --- generate --------------------------------------------------------------------------


def _add_generate(sub: argparse._SubParsersAction) -> None:
    from keyfill.synth.generate import GeneratorConfig as G

    p = sub.add_parser(
        "generate",
        help="write a synthetic payments archive (envelope format)",
        description="Write a realistic synthetic source archive: a payments topic with Zipf-skewed "
        "user keys placed by Kafka's default partitioner, out-of-order event times, null keys, "
        "optional headers. Deterministic for a given --seed.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", required=True, help="archive root: /path, file:///path or s3://bucket/prefix")
    p.add_argument("--topic", default=G.topic, help="topic name")
    p.add_argument("--partitions", type=_positive_int, default=G.partitions, help="Kafka partitions")
    p.add_argument("--keys", type=_positive_int, default=G.keys, help="distinct user keys")
    p.add_argument("--records", type=int, default=G.records, help="records in all")
    p.add_argument("--chunk-records", type=_positive_int, default=G.chunk_records, help="records per chunk file")
    p.add_argument("--skew", type=float, default=G.skew, help="Zipf exponent of the byte volume per key")
    p.add_argument("--seed", type=int, default=G.seed, help="random seed; same seed, same archive")
    p.add_argument("--jitter-ms", type=int, default=G.jitter_ms, help="bound on out-of-order event time")
    p.add_argument("--null-keys", type=_fraction, default=G.null_keys, help="fraction of records without a key")
    p.add_argument("--headers", action="store_true", help="give records Kafka headers (trace-id, source)")
    p.add_argument("--hot-key-share", type=float, default=None, help="give one key this share of all records, e.g. 0.9")
    p.add_argument("--rate", type=float, default=G.rate, help="records per second of event time")
    p.add_argument(
        "--start",
        type=_iso_ms,
        default=None,
        help="event time of the first record, ISO 8601 (default 2026-01-01T00:00:00Z)",
    )
    p.add_argument("--codec", default=G.codec, choices=["null", "deflate", "snappy"], help="Avro codec")
    p.add_argument("--threads", type=_positive_int, default=G.threads, help="parallel uploads")
    p.add_argument("--overwrite", action="store_true", help="replace an existing archive at --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(run=_run_generate)


def _run_generate(args: argparse.Namespace) -> int:
    from keyfill.synth.generate import GeneratorConfig, generate

    start_ms = {} if args.start is None else {"start_ms": args.start}
    cfg = GeneratorConfig(
        out=args.out,
        topic=args.topic,
        partitions=args.partitions,
        keys=args.keys,
        records=args.records,
        chunk_records=args.chunk_records,
        skew=args.skew,
        seed=args.seed,
        jitter_ms=args.jitter_ms,
        null_keys=args.null_keys,
        headers=args.headers,
        hot_key_share=args.hot_key_share,
        rate=args.rate,
        codec=args.codec,
        threads=args.threads,
        overwrite=args.overwrite,
        **start_ms,
    )
    r = generate(cfg, progress=not args.no_progress)
    if args.json:
        print(
            json.dumps(
                {
                    "url": r.url,
                    "records": r.records,
                    "chunks": r.chunks,
                    "bytes": r.bytes,
                    "seconds": round(r.seconds, 3),
                }
            )
        )
    else:
        rate = r.records / r.seconds if r.seconds else 0.0
        print(
            f"wrote {r.records:,} records in {r.chunks} chunks ({_mb(r.bytes)}) to {r.url} "
            f"in {r.seconds:.1f} s: {rate:,.0f} records/s, {r.bytes / 1e6 / max(r.seconds, 1e-9):,.1f} MB/s"
        )
    return 0


# --- inspect ---------------------------------------------------------------------------


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="summarise a source archive",
        description="Print an archive's partitions, chunks, records, bytes, time span and heaviest keys. "
        "Partitions and chunks come from file headers; the heaviest keys need one scan of the records.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("url", help="archive root: /path, file:///path or s3://bucket/prefix")
    p.add_argument("--top", type=int, default=10, help="heaviest keys to list")
    p.add_argument("--no-scan", action="store_true", help="headers only: skip the key scan")
    p.add_argument("--threads", type=_positive_int, default=8, help="parallel reads")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_inspect)


def _run_inspect(args: argparse.Namespace) -> int:
    from keyfill.summary import inspect_archive
    from keygroups.storage import open_storage

    store = open_storage(args.url, threads=args.threads)
    s = inspect_archive(
        store, top=args.top, scan=not args.no_scan, threads=args.threads, progress=not (args.no_progress or args.json)
    )
    if args.json:
        print(json.dumps(s.to_json(), indent=2))
        return 0
    print(f"archive   {s.url}")
    print(f"records   {s.records:,} in {s.chunks} chunks, {_mb(s.file_bytes)} on storage")
    print(
        f"time      {_iso(s.min_timestamp)} .. {_iso(s.max_timestamp)}"
        f" ({(s.max_timestamp - s.min_timestamp) / 1000:,.0f} s)"
    )
    print()
    print(f"{'topic':<16} {'part':>4} {'chunks':>6} {'records':>12} {'offsets':>25} {'MB':>10}")
    for p in s.partitions:
        offsets = f"{p.first_offset}..{p.last_offset}"
        print(f"{p.topic:<16} {p.partition:>4} {p.chunks:>6} {p.records:>12,} {offsets:>25} {p.bytes / 1e6:>10,.1f}")
    for gap in s.gaps:
        print(f"gap: {gap}")
    if s.heaviest_keys:
        print()
        print(f"{s.distinct_keys:,} distinct keys, {_mb(s.payload_bytes or 0)} of payload; heaviest:")
        print(f"{'key':<24} {'records':>12} {'bytes':>14} {'share':>7}")
        for k in s.heaviest_keys:
            name = "(null key)" if k.key is None else k.key
            print(f"{name:<24} {k.records:>12,} {k.bytes:>14,} {k.share:>7.2%}")
    return 0


# --- compact / verify ------------------------------------------------------------------


def add_source_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        dest="source_format",
        default="envelope",
        choices=["envelope", "kafka-connect"],
        help="source layout",
    )
    p.add_argument("--key-field", help="kafka-connect: value field holding the key (when no .keys.avro files)")
    p.add_argument("--timestamp-field", help="kafka-connect: value field holding the event time")


def add_compact_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by `keyfill compact` and `spark-submit jobs/compact.py`."""
    p.add_argument("source", help="source archive: /path, file:///path or s3://bucket/prefix")
    p.add_argument("dest", help="where the compacted archive goes")
    p.add_argument("--groups", type=_positive_int, required=True, help="key groups (the replay's parallelism)")
    p.add_argument("--slice-duration", default="10m", help="event-time length of a slice: 500ms, 90s, 10m, 1h, 1d")
    add_source_options(p)
    p.add_argument("--topic", help="topic to compact when the source holds several")
    p.add_argument("--codec", default="snappy", choices=["null", "deflate", "snappy"], help="Avro codec of group files")
    p.add_argument("--block-bytes", type=int, default=1 << 20, help="Avro block size of group files")
    p.add_argument(
        "--allow-gaps", action="store_true", help="accept offset gaps between chunks (compacted topics), reporting them"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing compacted archive at DEST")
    p.add_argument("--threads", type=_positive_int, default=16, help="I/O threads per task")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def compact_config(args: argparse.Namespace):
    from compactor.job import CompactConfig

    return CompactConfig(
        source=args.source,
        dest=args.dest,
        groups=args.groups,
        slice_duration=args.slice_duration,
        source_format=args.source_format,
        key_field=args.key_field,
        timestamp_field=args.timestamp_field,
        topic=args.topic,
        codec=args.codec,
        block_bytes=args.block_bytes,
        allow_gaps=args.allow_gaps,
        overwrite=args.overwrite,
        threads=args.threads,
    )


def print_compact_result(r, as_json: bool) -> None:
    from dataclasses import asdict

    if as_json:
        print(json.dumps(asdict(r), indent=2))
        return
    rate = r.records / r.seconds if r.seconds else 0.0
    print(f"compacted {r.records:,} records ({_mb(r.payload_bytes)} payload) into {r.dest}")
    print(f"  {r.groups} groups x {r.slices} slices ({r.empty_slices} empty): {r.files} files, {_mb(r.file_bytes)}")
    print(
        f"  {r.keys:,} keys; group bytes max {r.max_group_bytes:,} / mean {r.mean_group_bytes:,.0f}"
        f" = {r.max_group_bytes / max(r.mean_group_bytes, 1):.3f}"
    )
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in r.phases.items())
    print(f"  {r.seconds:.1f} s ({rate:,.0f} records/s): {phases}")


def _add_compact(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compact",
        help="compact a source archive into key groups (embedded local Spark)",
        description="Rewrite a partition-ordered archive as one Avro file per (slice, key group), keys packed "
        "into volume-balanced groups. Runs on an embedded Spark (--master, default local[*]); on a cluster use "
        "`spark-submit jobs/compact.py` with the same options.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_compact_arguments(p)
    p.add_argument("--master", default="local[*]", help="Spark master of the embedded session")
    p.add_argument("--driver-memory", default="4g", help="memory of the embedded Spark driver")
    p.set_defaults(run=_run_compact)


def _run_compact(args: argparse.Namespace) -> int:
    import logging

    from compactor.job import compact
    from compactor.spark_session import local_spark

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg = compact_config(args)
    spark = local_spark(args.master, app="keyfill compact", driver_memory=args.driver_memory)
    spark.sparkContext.setLogLevel("WARN")
    try:
        print_compact_result(compact(cfg, spark), args.json)
    finally:
        spark.stop()
    return 0


def _add_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="audit a compacted archive against its source",
        description="Prove nothing was lost, duplicated or reordered: every source record exactly once (counts and "
        "a per-partition fingerprint), offsets covered without gaps or overlaps, each key in offset order and in "
        "its group, slice bounds, file checksums, hand-off offsets. Exits 1 with a report on any violation.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("source", help="the source archive")
    p.add_argument("dest", help="the compacted archive")
    add_source_options(p)
    p.add_argument("--threads", type=_positive_int, default=8, help="parallel reads")
    p.add_argument(
        "--spark",
        action="store_true",
        help="check records on an embedded Spark (--master) instead of in this process: for archives "
        "whose offsets do not fit in memory",
    )
    p.add_argument("--master", default="local[*]", help="Spark master with --spark")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_verify)


def _run_verify(args: argparse.Namespace) -> int:
    from compactor.sources import open_source
    from compactor.verify import verify
    from keygroups.storage import open_storage

    source = open_source(
        args.source,
        format=args.source_format,
        key_field=args.key_field,
        timestamp_field=args.timestamp_field,
        threads=args.threads,
    )
    dest = open_storage(args.dest, threads=args.threads)
    if args.spark:
        from compactor.spark_session import local_spark
        from compactor.verify import verify_spark

        spark = local_spark(args.master, app="keyfill verify")
        spark.sparkContext.setLogLevel("WARN")
        try:
            report = verify_spark(source, dest, spark)
        finally:
            spark.stop()
    else:
        report = verify(source, dest, threads=args.threads, progress=not (args.no_progress or args.json))
    print_verify_report(report, args.json)
    return 0 if report.ok else 1


def print_verify_report(report, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        for check, count in report.counts.items():
            if check in report.not_run:
                print(f"skip {check:<13} not run: the manifest is needed to check it")
                continue
            print(f"{'ok  ' if count == 0 else 'FAIL'} {check:<13} {'' if count == 0 else f'{count} violation(s)'}")
            for message in report.violations[check]:
                print(f"     {message}")
        verdict = "verified" if report.ok else "NOT verified"
        print(f"{verdict}: {report.records:,} records in {report.files} files of {report.dest}")


# --- replay ----------------------------------------------------------------------------


def _add_replay(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a compacted archive to a null sink, with progress",
        description="Replay a compacted archive with T threads in slice lockstep and drop the records: measures "
        "replay speed and exercises checkpoints. With --checkpoint-file, the position is saved there after every "
        "watermark (and on interrupt) and a run resumes from it when the file exists.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("url", help="compacted archive")
    p.add_argument("--threads", type=_positive_int, default=16, help="reader threads")
    p.add_argument("--batch-size", type=_positive_int, default=65_536, help="records per batch")
    p.add_argument(
        "--watermark-bound-ms",
        type=_non_negative_int,
        default=0,
        help="bounded out-of-orderness B of the watermarks (watermark = slice end - B)",
    )
    p.add_argument(
        "--max-drift-ms", type=_non_negative_int, help="pause threads this far ahead of the slowest in event time"
    )
    p.add_argument("--checkpoint-file", help="save the position here; resume from it if it exists")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(run=_run_replay)


def _run_replay(args: argparse.Namespace) -> int:
    import os
    import time

    from tqdm import tqdm

    import reader

    resume = None
    if args.checkpoint_file and os.path.exists(args.checkpoint_file):
        try:
            with open(args.checkpoint_file) as f:
                resume = json.load(f)
        except (OSError, ValueError) as exc:
            raise reader.CheckpointError(
                f"checkpoint file {args.checkpoint_file}: not a readable keyfill checkpoint "
                f"({exc}); delete it to start from the beginning"
            ) from None

    def save(state: dict) -> None:
        if args.checkpoint_file:
            tmp = args.checkpoint_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump(state, f)
            os.replace(tmp, args.checkpoint_file)  # a crash never leaves half a checkpoint

    records = 0
    watermark = None
    started = time.perf_counter()
    try:
        events = reader.replay(
            args.url,
            threads=args.threads,
            resume=resume,
            batch_size=args.batch_size,
            watermark_bound_ms=args.watermark_bound_ms,
            max_drift_ms=args.max_drift_ms,
        )
    except reader.CheckpointError as exc:
        raise reader.CheckpointError(f"checkpoint file {args.checkpoint_file}: {exc}") from None
    with events:
        total = events.manifest.totals["records"]
        bar = tqdm(
            total=total,
            unit="rec",
            unit_scale=True,
            desc="replay",
            disable=args.no_progress or args.json,
            initial=0,
            mininterval=0.5,
        )
        try:
            for ev in events:
                if isinstance(ev, reader.Records):
                    records += ev.batch.num_rows
                    bar.update(ev.batch.num_rows)
                else:
                    watermark = ev.timestamp_ms
                    bar.set_postfix_str(
                        f"watermark {_iso(watermark)}, spread {events.spread_ms() / 1000:.1f} s", refresh=False
                    )
                    save(events.checkpoint())
        except KeyboardInterrupt:
            save(events.checkpoint())
            raise
        finally:
            bar.close()
        save(events.checkpoint())
    seconds = time.perf_counter() - started
    summary = {
        "records": records,
        "seconds": round(seconds, 3),
        "records_per_second": round(records / seconds),
        "watermark": watermark,
        "threads": args.threads,
        "resumed": resume is not None,
        "max_spread_ms": events.max_spread_ms,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        last = "none" if watermark is None else _iso(watermark)
        print(
            f"replayed {records:,} records in {seconds:.1f} s ({records / seconds:,.0f} records/s) with "
            f"{args.threads} threads; last watermark {last}; max event-time spread across threads "
            f"{events.max_spread_ms / 1000:.1f} s" + (" (resumed)" if resume else "")
        )
    return 0


# --- handoff ---------------------------------------------------------------------------


def _add_handoff(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "handoff",
        help="print where a live Kafka consumer starts after the backfill",
        description="Print, from the compacted archive's manifest, the next offset after the archive for every "
        "partition: as Spark's Kafka source startingOffsets JSON (spark), as the CSV that "
        "`kafka-consumer-groups --reset-offsets --from-file` takes (csv: topic,partition,offset), or as a JSON "
        "summary (json).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("url", help="compacted archive")
    p.add_argument("--format", choices=["spark", "csv", "json"], default="spark", help="output form")
    p.set_defaults(run=_run_handoff)


def _run_handoff(args: argparse.Namespace) -> int:
    from keygroups import compacted, handoff
    from keygroups.storage import open_storage

    store = open_storage(args.url)
    sys.stdout.write(handoff.render(compacted.load_manifest(store), store.url, args.format))
    return 0


# --- main ------------------------------------------------------------------------------


# The last line of a Python traceback raised in a Spark task by one of our packages:
# "keygroups.errors.CorruptFile: <message>" (Spark wraps it; its type cannot be caught).
_TASK_ERROR = re.compile(r"^(?:keygroups|compactor|keyfill|reader)\.[\w.]*\.[A-Z]\w*: (.+)$", re.M)


def _spark_task_error(exc: Exception) -> str | None:
    """The keyfill error raised inside a Spark task: Spark wraps it in its own exception
    with both tracebacks; the user needs the one line that names the object."""
    found = _TASK_ERROR.findall(str(exc))
    return found[-1].strip() if found else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keyfill",
        description="Fast historical backfill: compact a Kafka archive into volume-balanced key "
        "groups once, then replay it in parallel with per-key order and lockstep event time.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_generate(sub)
    _add_inspect(sub)
    _add_compact(sub)
    _add_verify(sub)
    _add_replay(sub)
    _add_handoff(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from keygroups.errors import KeyfillError

    try:
        return args.run(args)
    except KeyfillError as exc:
        print(f"keyfill {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        cause = _spark_task_error(exc)
        if cause is None:
            raise  # a bug: the traceback is what a report needs
        print(f"keyfill {args.command}: error: {cause}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"keyfill {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
