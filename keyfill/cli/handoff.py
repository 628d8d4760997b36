"""`keyfill handoff`: where a live Kafka consumer starts after the backfill."""

from __future__ import annotations

import argparse
import sys


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    from keygroups import compacted, handoff
    from keygroups.storage import open_storage

    store = open_storage(args.url)
    sys.stdout.write(handoff.render(compacted.load_manifest(store), store.url, args.format))
    return 0
