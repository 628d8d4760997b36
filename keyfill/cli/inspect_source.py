"""`keyfill inspect`: summarise a source archive (or a compacted one: `inspect_compacted`)."""

from __future__ import annotations

import argparse
import json

from keyfill.cli.args import add_source_options, iso, mb, positive_int


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "inspect",
        help="summarise a source or compacted archive",
        description="Print a source archive's partitions, chunks, records, bytes, time span and heaviest keys "
        "(partitions and chunks come from file headers; the heaviest keys need one scan of the records), or a "
        "compacted archive's slices, groups, files and replay cost (from its manifest).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("url", help="archive root: a path, or an s3://, gs:// or az:// URL")
    add_source_options(p)
    p.add_argument("--top", type=int, default=10, help="heaviest keys to list")
    p.add_argument("--no-scan", action="store_true", help="headers only: skip the key scan")
    p.add_argument("--threads", type=positive_int, default=8, help="parallel reads")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    import keyfill.cli.inspect_compacted as inspect_compacted  # by its own name: not through keyfill.cli
    from compactor.sources import FORMATS, source_options
    from keyfill.cli.args import source_options_from_args
    from keyfill.summary import inspect_archive
    from keygroups import compacted
    from keygroups.storage import open_storage

    source_options(args.source_format, source_options_from_args(args))  # another format's flag fails here
    if FORMATS[args.source_format].storage_url:  # else a table or catalog URL, never a compacted archive
        store = open_storage(args.url, threads=args.threads)
        if compacted.versions(store) or store.exists(compacted.LEGACY_MANIFEST):
            return inspect_compacted.show(store, args.json)
    progress = not (args.no_progress or args.json)
    if args.source_format == "envelope":
        s = inspect_archive(store, top=args.top, scan=not args.no_scan, threads=args.threads, progress=progress)
    else:  # no statistics in these formats' headers: one read of every chunk gives them all
        from keyfill.cli.args import source_from_args
        from keyfill.summary import inspect_source

        source = source_from_args(args, args.url, threads=args.threads)
        s = inspect_source(source, top=args.top, threads=args.threads, progress=progress)
    if args.json:
        print(json.dumps(s.to_json(), indent=2))
        return 0
    print(f"archive   {s.url}")
    print(f"records   {s.records:,} in {s.chunks} chunks, {mb(s.file_bytes)} on storage")
    print(
        f"time      {iso(s.min_timestamp)} .. {iso(s.max_timestamp)}"
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
        print(f"{s.distinct_keys:,} distinct keys, {mb(s.payload_bytes or 0)} of payload; heaviest:")
        print(f"{'key':<24} {'records':>12} {'bytes':>14} {'share':>7}")
        for k in s.heaviest_keys:
            name = "(null key)" if k.key is None else k.key
            print(f"{name:<24} {k.records:>12,} {k.bytes:>14,} {k.share:>7.2%}")
    return 0
