"""`keyfill verify`: audit a compacted archive against its source."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from keyfill.cli.args import add_embedded_spark_arguments, add_source_options, positive_int

if TYPE_CHECKING:
    from compactor.verify import VerifyReport


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "verify",
        help="audit a compacted archive against its source",
        description="Prove nothing was lost, duplicated or reordered: every source record exactly once (its offset "
        "and its fingerprint), offsets covered without gaps or overlaps, each key in offset order and in "
        "its group, slice bounds, file checksums, hand-off offsets. Exits 1 with a report on any violation (the "
        "archive is wrong); exits 2 with one line naming the request when the source or the archive could not be read "
        "(a store that fails or does not answer: a check that could not read is not a failed check).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("source", help="the source archive")
    p.add_argument("dest", help="the compacted archive")
    add_source_options(p)
    p.add_argument("--threads", type=positive_int, default=8, help="parallel reads")
    p.add_argument(
        "--spark",
        action="store_true",
        help="run the audit's tasks on Spark instead of in this process (the same checks, the same report): an "
        "embedded one (--master), or a Spark Connect server's (--remote); for archives whose records' offsets do not "
        "fit in memory",
    )
    add_embedded_spark_arguments(p, memory=False)
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    from compactor.verify import verify
    from keyfill.cli.args import session_flags, source_from_args, spark_for
    from keygroups.errors import OptionError
    from keygroups.storage import open_storage

    session_flags(args)
    if not args.spark and hasattr(args, "master"):
        raise OptionError("--master applies to --spark only (the audit runs in this process without it)")
    source = source_from_args(args, args.source, threads=args.threads)
    dest = open_storage(args.dest, threads=args.threads)
    if args.spark or hasattr(args, "remote"):
        from compactor.verify.spark import verify_spark

        with spark_for(args, "keyfill verify") as spark:
            report = verify_spark(source, dest, spark)
    else:
        report = verify(source, dest, threads=args.threads, progress=not (args.no_progress or args.json))
    print_verify_report(report, args.json)
    return 0 if report.ok else 1


def print_verify_report(report: VerifyReport, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        for check, count in report.counts.items():
            if check in report.skipped:
                print(f"skip {check:<13} not run: the manifest is needed to check it")
                continue
            print(f"{'ok  ' if count == 0 else 'FAIL'} {check:<13} {'' if count == 0 else f'{count} violation(s)'}")
            for message in report.violations[check]:
                print(f"     {message}")
        verdict = "verified" if report.ok else "NOT verified"
        print(f"{verdict}: {report.records:,} records in {report.files} files of {report.dest}")
