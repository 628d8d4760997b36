"""`keyfill compact` (and the options `spark-submit jobs/compact.py` shares)."""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import TYPE_CHECKING

from compactor import defaults
from keyfill.cli.args import (
    add_embedded_spark_arguments,
    add_source_options,
    byte_size,
    fraction,
    mb,
    positive_int,
    session_flags,
    source_options_from_args,
    spark_for,
)
from keygroups import envelope  # loaded anyway: the source registry's flags import it

if TYPE_CHECKING:
    from compactor.config import CompactConfig, CompactResult


def add_compact_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by `keyfill compact` and `spark-submit jobs/compact.py`."""
    p.add_argument("source", help="source archive: /path, file:///path, s3://, gs:// or az:// (abfss://, wasbs://) URL")
    p.add_argument("dest", help="where the compacted archive goes")
    p.add_argument(
        "--groups",
        type=positive_int,
        help="key groups, the replay's parallelism (default: from the data, 16 to 1024: one per 4 target files "
        "of payload, a power of two)",
    )
    p.add_argument(
        "--slice-duration",
        help="event-time length of a slice (the watermark step): 500ms, 90s, 10m, 1h. Default: derived from the "
        "statistics, the shortest of 1m, 2m, 5m, ... 12h, 1d whose slices hold 64 KiB of payload per group on "
        "average (busy topics get 1m, sparse ones hours); --append keeps the archive's",
    )
    p.add_argument(
        "--target-file-bytes",
        type=byte_size,
        default=defaults.TARGET_FILE_BYTES,
        help="segment files are cut at the first slice boundary past this size: 64MiB, 256MB, 1GiB",
    )
    add_source_options(p)
    p.add_argument("--topic", help="topic to compact when the source holds several")
    p.add_argument("--codec", default=defaults.CODEC, choices=envelope.CODECS, help="Avro codec of segment files")
    p.add_argument("--block-bytes", type=int, default=defaults.BLOCK_BYTES, help="largest Avro block of segment files")
    p.add_argument(
        "--allow-gaps", action="store_true", help="accept offset gaps between chunks (compacted topics), reporting them"
    )
    p.add_argument(
        "--seal-all",
        action="store_true",
        help="publish every slice, also those a lagging partition could still add records to (a topic that will "
        "not grow); by default they are left out and the hand-off offsets point at their first records",
    )
    p.add_argument(
        "--max-held-back",
        type=fraction,
        metavar="FRACTION",
        help="fail, committing nothing, when more than this share of the run's records would be held back in slices "
        "not sealed yet (e.g. 0.05 in scheduled jobs); by default more than 5%% is a warning",
    )
    p.add_argument(
        "--idle-after",
        metavar="DURATION",
        help="a partition whose running maximum is this far behind the newest partition's does not hold sealing "
        "back (like Flink's idleness, on event time); its later records behind the published slices are placed in "
        "the next append's first slice and counted as made late. Default: no partition is idle",
    )
    p.add_argument(
        "--append",
        action="store_true",
        help="grow the archive at DEST with the source's records from its hand-off offsets on, as a new version "
        "(keeps its groups, slices and identity; starts it when DEST is empty)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing compacted archive at DEST")
    p.add_argument("--threads", type=positive_int, default=defaults.IO_THREADS, help="I/O threads per task")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def compact_config(args: argparse.Namespace) -> CompactConfig:
    from compactor.job import CompactConfig

    return CompactConfig(
        source=args.source,
        dest=args.dest,
        groups=args.groups,
        slice_duration=args.slice_duration,
        source_format=args.source_format,
        source_options=source_options_from_args(args),
        topic=args.topic,
        codec=args.codec,
        block_bytes=args.block_bytes,
        target_file_bytes=args.target_file_bytes,
        allow_gaps=args.allow_gaps,
        seal_all=args.seal_all,
        idle_after=args.idle_after,
        max_held_back=args.max_held_back,
        overwrite=args.overwrite,
        append=args.append,
        threads=args.threads,
    )


def print_compact_result(r: CompactResult, as_json: bool) -> None:
    from dataclasses import asdict

    if as_json:
        print(json.dumps(asdict(r), indent=2))
        return
    rate = r.new_records / r.seconds if r.seconds else 0.0
    if r.kind == "append":
        print(
            f"appended {r.new_records:,} records ({r.new_keys:,} new keys) as slices {r.first_slice}..{r.slices - 1} "
            f"of {r.dest}, version {r.version} (run {r.run}); the archive now holds {r.records:,} records "
            f"({mb(r.payload_bytes)})"
        )
    else:
        print(
            f"compacted {r.records:,} records ({mb(r.payload_bytes)} payload) into {r.dest}, version {r.version} "
            f"(run {r.run})"
        )
    print(
        f"  {r.groups} groups x {r.slices} slices ({r.empty_slices} empty): {r.pieces:,} pieces in {r.files} files, "
        f"{mb(r.file_bytes)}"
    )
    if r.files:
        per_gb = r.replay_gets / max(r.file_bytes / 1e9, 1e-9)
        print(
            f"  average file {mb(r.file_bytes // r.files)}; a replay makes about {per_gb:,.0f} GETs per GB "
            f"({r.replay_gets:,} GETs of at most {mb(r.range_bytes)})"
        )
    print(
        f"  {r.keys:,} keys; group bytes max {r.max_group_bytes:,} / mean {r.mean_group_bytes:,.0f}"
        f" = {r.max_group_bytes / max(r.mean_group_bytes, 1):.3f}"
    )
    if r.withheld:
        from compactor.job import HELD_BACK_WARNING

        share = r.withheld / max(r.new_records + r.withheld, 1)
        loud = "WARNING: " if share > HELD_BACK_WARNING else ""
        print(
            f"  {loud}{r.withheld:,} records ({share:.1%} of this run's) of slices not sealed yet held back: the "
            "hand-off offsets point at them (`keyfill handoff`); --seal-all publishes them, --max-held-back makes too "
            "many an error"
        )
    if r.idle:
        print(f"  partitions {', '.join(map(str, r.idle))} idle (--idle-after): they did not hold sealing back")
    if r.made_late:
        print(f"  {r.made_late:,} records of idle or new partitions placed after their own slice: made late")
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in r.phases.items())
    print(f"  {r.seconds:.1f} s ({rate:,.0f} records/s): {phases}")


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "compact",
        help="compact a source archive into key groups (embedded local Spark)",
        description="Rewrite a partition-ordered archive as key groups (keys packed into volume-balanced "
        "groups), each group's records in segment files of consecutive event-time slices, with a piece index. "
        "Runs on an embedded Spark (--master, default local[*]), or on a Spark Connect server (--remote "
        "sc://host:15002, or SPARK_REMOTE); on a cluster also `spark-submit jobs/compact.py` with the same options.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_compact_arguments(p)
    add_embedded_spark_arguments(p)
    p.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    from compactor.job import compact, prepare

    session_flags(args)  # both given: refused before any work
    cfg = compact_config(args)
    prepared = prepare(cfg)  # every check that needs no Spark, before its start-up
    with contextlib.ExitStack() as session:
        with prepared.abandoned_on_error():
            spark = session.enter_context(spark_for(args, "keyfill compact"))
        print_compact_result(compact(cfg, spark, prepared), args.json)
    return 0
