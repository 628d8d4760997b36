"""`keyfill compact` (and the options `spark-submit jobs/compact.py` shares)."""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import TYPE_CHECKING, Any

from compactor import defaults
from keyfill.cli.args import byte_size, fraction, mb, positive_int
from keygroups import envelope  # loaded anyway: the source registry's flags import it

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from compactor.config import CompactConfig, CompactResult
    from compactor.sources import SourceArchive

_OPTION_DEST = "source_option."  # a format's option `name` is parsed into `source_option.<name>`


def add_source_options(p: argparse.ArgumentParser) -> None:
    """`--format`, its choices from the source registry, and every format's own flags, each
    format's under a heading of its own: what a format declares (`compactor.sources`)."""
    from compactor.sources import FORMATS, Option

    p.add_argument(
        "--format", dest="source_format", default=defaults.SOURCE_FORMAT, choices=list(FORMATS), help="source layout"
    )
    added: dict[str, tuple[Option, argparse.Action]] = {}
    for name, source in FORMATS.items():
        group = None
        for o in source.Options.options():
            if o.flag in added:  # an option two formats take: one flag, its help naming both
                first, action = added[o.flag]
                if first.switch != o.switch:
                    raise AssertionError(f"{o.flag}: a switch for one format and not for another")
                action.help = f"{action.help} (also --format {name})"
                continue
            group = group or p.add_argument_group(f"options of --format {name}")
            kw = {"action": "store_true"} if o.switch else {"metavar": o.metavar}
            action = group.add_argument(
                o.flag, dest=_OPTION_DEST + o.name, default=argparse.SUPPRESS, help=f"{name}: {o.help}", **kw
            )
            added[o.flag] = (o, action)


def source_options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The format options given on the command line, by name (checked by the format)."""
    return {k.removeprefix(_OPTION_DEST): v for k, v in vars(args).items() if k.startswith(_OPTION_DEST)}


def source_from_args(args: argparse.Namespace, url: str, **kw: Any) -> SourceArchive:
    """The source archive at `url` as the options of `add_source_options` describe it
    (`kw`: e.g. threads), for the subcommands and jobs that read a source."""
    from compactor.sources import open_source

    return open_source(url, format=args.source_format, options=source_options_from_args(args), **kw)


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


def log_to_terminal(verbosity: int = 0) -> None:
    """keyfill's own progress lines at INFO on stderr; everyone else's (botocore, py4j) only
    from WARNING, so the last line a failed run prints is keyfill's error. `verbosity`: -1
    (-q) keyfill's warnings only; 1 (-v) keyfill's debug lines and others' INFO."""
    import logging

    others = logging.INFO if verbosity > 0 else logging.WARNING
    ours = {-1: logging.WARNING, 0: logging.INFO}.get(min(verbosity, 1), logging.DEBUG)
    logging.basicConfig(level=others, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("keyfill").setLevel(ours)


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


def add_embedded_spark_arguments(p: argparse.ArgumentParser, memory: bool = True) -> None:
    """`--master` (an embedded Spark) or `--remote` (a Spark Connect server's), not both."""
    where = p.add_mutually_exclusive_group()  # absent when not given (no "default: None" in --help)
    where.add_argument(
        "--master", default=argparse.SUPPRESS, help="Spark master of the embedded session (default: local[*])"
    )
    where.add_argument(
        "--remote",
        default=argparse.SUPPRESS,
        metavar="URL",
        help="run on a Spark Connect server instead, e.g. sc://host:15002 (default: $SPARK_REMOTE when set); its "
        "executors open the archives with the cluster's credentials and storage settings, not this machine's",
    )
    if memory:
        p.add_argument("--driver-memory", default="4g", help="memory of the embedded Spark driver")


def session_flags(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """`--master` and `--remote` as given (None: not), `SPARK_REMOTE` standing in for the
    second; both refused (`compactor.spark_session.session_arguments`)."""
    from compactor.spark_session import session_arguments

    return session_arguments(getattr(args, "master", None), getattr(args, "remote", None))


def spark_for(args: argparse.Namespace, app: str, **kw: Any) -> contextlib.AbstractContextManager[SparkSession]:
    """The session a command's `--master` / `--remote` name (`compactor.spark_session`)."""
    from compactor.spark_session import embedded_spark

    master, remote = session_flags(args)
    memory = getattr(args, "driver_memory", None)
    if memory is not None:
        kw["driver_memory"] = memory
    return embedded_spark(master, app=app, remote=remote, **kw)


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
