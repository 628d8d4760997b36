"""What the subcommands share: argument types, output formats, the source's options, the
Spark session's flags, logging to the terminal."""

from __future__ import annotations

import argparse
import contextlib
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from compactor import defaults

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from compactor.sources import SourceArchive


def iso(ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC; out of datetime's range, the number itself."""
    try:
        return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"
    except (ValueError, OverflowError, OSError):
        return f"{ms} ms"


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction in [0, 1]")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def iso_ms(text: str) -> int:
    """An ISO 8601 time (UTC unless it says otherwise) as epoch milliseconds."""
    try:
        start = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time like 2026-01-01T00:00:00Z") from None
    if start.tzinfo is None:
        start = start.replace(tzinfo=timezone.utc)
    return int(start.timestamp() * 1000)


def time_ms(text: str) -> int:
    """Epoch milliseconds, given as such (as Spark's Kafka source takes them) or as an ISO 8601 time."""
    try:
        return int(text)
    except ValueError:
        return iso_ms(text)


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9}
_UNITS |= {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def byte_size(text: str) -> int:
    """A size in bytes: 67108864, 64MiB, 64MB, 1GiB (case-insensitive)."""
    t = text.strip().lower()
    digits = len(t) - len(t.lstrip("0123456789"))
    unit = t[digits:].strip()
    if not digits or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 67108864, 64MiB or 1GB")
    return int(t[:digits]) * _UNITS[unit]


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


def log_to_terminal(verbosity: int = 0) -> None:
    """keyfill's own progress lines at INFO on stderr; everyone else's (botocore, py4j) only
    from WARNING, so the last line a failed run prints is keyfill's error. `verbosity`: -1
    (-q) keyfill's warnings only; 1 (-v) keyfill's debug lines and others' INFO."""
    import logging

    others = logging.INFO if verbosity > 0 else logging.WARNING
    ours = {-1: logging.WARNING, 0: logging.INFO}.get(min(verbosity, 1), logging.DEBUG)
    logging.basicConfig(level=others, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("keyfill").setLevel(ours)


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
