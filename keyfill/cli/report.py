"""`keyfill report`: one self-contained HTML page of pictures about a compacted archive."""

from __future__ import annotations

import argparse
import json

from keyfill.cli.args import positive_int


def non_negative_seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds >= 0")
    return value


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        help="write an HTML report with pictures of a compacted archive",
        description="Write one self-contained HTML file (pictures embedded, opens in any browser) about the latest "
        "version of a compacted archive: group balance, bytes per slice over event time, records held back per "
        "partition, and the throughput of a short replay on this machine.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("url", help="compacted archive")
    p.add_argument("--out", default="keyfill-report.html", help="the HTML file to write")
    p.add_argument(
        "--replay-seconds",
        type=non_negative_seconds,
        default=10.0,
        help="replay for at most this long to draw the throughput (0: no replay)",
    )
    p.add_argument("--threads", type=positive_int, default=4, help="threads of that replay")
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of a line")
    p.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    from keyfill.report import write_report

    data = write_report(args.url, args.out, replay_seconds=args.replay_seconds, threads=args.threads)
    summary = {
        "report": args.out,
        "version": data.manifest.version,
        "slices": int(len(data.slice_bytes)),
        "replay_records_per_second": round(data.replay.rate) if data.replay else None,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        rate = f"; replay {summary['replay_records_per_second']:,} records/s" if data.replay else ""
        print(f"wrote {args.out}: version {data.manifest.version} of {data.url}, {summary['slices']:,} slices{rate}")
    return 0
