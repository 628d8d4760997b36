"""`keyfill plan`: a compaction's statistics pass alone, and what the compaction would make."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from compactor.estimate import Estimate


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from keyfill.cli.args import add_embedded_spark_arguments
    from keyfill.cli.compact import add_compact_arguments

    p = sub.add_parser(
        "plan",
        help="what a compaction would produce, from its statistics pass alone (writes nothing)",
        description="Run the compaction's statistics pass and packing, write nothing, and report what `keyfill "
        "compact` with the same options would make: slices, pieces, files, archive size, GETs per GB, Spark "
        "micro-batches at the default trigger, group balance, records held back, and what to change.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_compact_arguments(p)
    add_embedded_spark_arguments(p)
    p.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    from compactor.estimate import estimate
    from compactor.execution import for_session
    from compactor.job import analyse, prepare
    from keyfill.cli.args import session_flags, spark_for
    from keyfill.cli.compact import compact_config

    session_flags(args)
    prepared = prepare(compact_config(args), dry_run=True)
    with spark_for(args, "keyfill plan", progress=False, log_level="ERROR") as spark:
        e = estimate(prepared, analyse(prepared, for_session(spark), {}))
    if args.json:
        print(json.dumps(e.to_json(), indent=2))
    else:
        print_estimate(e)
    return 0


def print_estimate(e: Estimate) -> None:
    from keyfill.cli.args import mb

    how = "derived from the data" if e.derived else "as given"
    print(f"plan for {e.source} -> {e.dest} (nothing written)")
    print(f"  slices of {e.slice_duration} ({how}): {e.slices:,} ({e.empty_slices:,} empty)")
    print(f"  {e.groups} groups, largest / mean = {e.group_balance:.2f}; {e.keys:,} keys")
    print(f"  {e.records:,} records published ({mb(e.payload_bytes)} payload in all)")
    if e.held_back:
        print(
            f"  {e.held_back:,} records ({e.held_back_share:.1%}) held back in slices not sealed yet "
            f"(partition {e.seal_holder} holds the seal)"
        )
    print(
        f"  about {e.pieces:,} pieces in {e.files:,} files, {mb(e.archive_bytes)} (source {mb(e.source_bytes)}); "
        f"{e.gets_per_gb:,.0f} GETs per GB"
    )
    print(f"  Spark source: {e.micro_batches:,} micro-batches at its default trigger (512 MiB)")
    for r in e.recommendations:
        print(f"  recommendation: {r}")
