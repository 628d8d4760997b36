"""`keyfill generate`: a synthetic payments archive."""

from __future__ import annotations

import argparse
import json

from keyfill.cli.args import fraction, iso_ms, mb, positive_int
from keygroups.durations import parse_duration


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from keyfill.synth.generate import GeneratorConfig as G
    from keygroups import envelope

    p = sub.add_parser(
        "generate",
        help="write a synthetic payments archive (envelope format)",
        description="Write a realistic synthetic source archive: a payments topic with Zipf-skewed "
        "user keys placed by Kafka's default partitioner, out-of-order event times, null keys, "
        "optional headers. Deterministic for a given --seed.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", required=True, help="archive root: a path, or an s3://, gs:// or az:// URL")
    p.add_argument("--topic", default=G.topic, help="topic name")
    p.add_argument("--partitions", type=positive_int, default=G.partitions, help="Kafka partitions")
    p.add_argument("--keys", type=positive_int, default=G.keys, help="distinct user keys")
    p.add_argument("--records", type=int, default=G.records, help="records in all")
    p.add_argument("--chunk-records", type=positive_int, default=G.chunk_records, help="records per chunk file")
    p.add_argument("--skew", type=float, default=G.skew, help="Zipf exponent of the byte volume per key")
    p.add_argument("--seed", type=int, default=G.seed, help="random seed; same seed, same archive")
    p.add_argument("--jitter-ms", type=int, default=G.jitter_ms, help="bound on out-of-order event time")
    p.add_argument("--null-keys", type=fraction, default=G.null_keys, help="fraction of records without a key")
    p.add_argument("--headers", action="store_true", help="give records Kafka headers (trace-id, source)")
    p.add_argument("--hot-key-share", type=float, default=None, help="give one key this share of all records, e.g. 0.9")
    p.add_argument("--rate", type=float, default=G.rate, help="records per second of event time")
    p.add_argument(
        "--start",
        type=iso_ms,
        default=None,
        help="event time of the first record, ISO 8601 (default 2026-01-01T00:00:00Z)",
    )
    p.add_argument("--codec", default=G.codec, choices=envelope.CODECS, help="Avro codec")
    p.add_argument(
        "--logins",
        metavar="URL",
        help="also write a logins topic that goes with the payments to this root: a login by the same user "
        "1-30 s before about one payment in ten (for joins of topics, jobs/fraud_join.py)",
    )
    p.add_argument(
        "--logins-after",
        type=lambda text: parse_duration(text, option="--logins-after"),
        default=0,
        metavar="DURATION",
        help="the logins start this long after the payments, e.g. 7d or 1m (default: with them)",
    )
    p.add_argument("--threads", type=positive_int, default=G.threads, help="parallel uploads")
    p.add_argument("--overwrite", action="store_true", help="replace an existing archive at --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
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
        logins_out=args.logins,
        logins_after_ms=args.logins_after,
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
                    "logins": r.logins,
                }
            )
        )
    else:
        rate = r.records / r.seconds if r.seconds else 0.0
        print(
            f"wrote {r.records:,} records in {r.chunks} chunks ({mb(r.bytes)}) to {r.url} "
            f"in {r.seconds:.1f} s: {rate:,.0f} records/s, {r.bytes / 1e6 / max(r.seconds, 1e-9):,.1f} MB/s"
        )
        if args.logins:
            print(f"and {r.logins:,} logins to {args.logins}")
    return 0
