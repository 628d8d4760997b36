"""`keyfill jobs`: where the spark-submit entry points of this installation are."""

from __future__ import annotations

import argparse
import importlib.util

from keygroups.errors import KeyfillError

JOBS = {
    "compact": ("jobs.compact", "the compaction (same options as `keyfill compact`)"),
    "verify": ("jobs.verify", "the audit, records checked in Spark (as `keyfill verify --spark`)"),
    "fraud-backfill": ("jobs.fraud_backfill", "the worked example: a stateful streaming job over the archive"),
    "fraud-join": ("jobs.fraud_join", "the worked example of a join of two topics, both sources paced in event time"),
}


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "jobs",
        help="print the paths of the spark-submit job scripts",
        description="spark-submit takes a job's main script as a file. The scripts come with keyfill: this prints "
        'where this installation keeps them, e.g. spark-submit --py-files dist/keyfill-*.whl "$(keyfill jobs '
        'compact)" SRC DEST ...; each also runs as python -m jobs.compact, on an embedded local Spark.',
    )
    p.add_argument("name", nargs="?", choices=sorted(JOBS), help="one job: print its path alone")
    p.set_defaults(handle=handle)


def path(name: str) -> str:
    spec = importlib.util.find_spec(JOBS[name][0])
    if spec is None or spec.origin is None:  # an installation without the jobs package's files
        raise KeyfillError(f"job {name}: module {JOBS[name][0]} not found in this installation")
    return spec.origin


def handle(args: argparse.Namespace) -> int:
    if args.name:
        print(path(args.name))
        return 0
    for name, (module, what) in JOBS.items():
        print(f"{name:15} {path(name)}\n{'':15} {what}; python -m {module}")
    return 0
