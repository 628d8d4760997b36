"""The `keyfill` command: one entry point, a module per subcommand.

Each subcommand imports its package only when it runs, so `keyfill generate` never starts
Spark.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from keyfill.cli import (
    compact,
    generate,
    handoff,
    inspect_source,
    jobs,
    plan,
    replay,
    report,
    vacuum,
    verify,
    versions,
    warm,
    worker_python,
)
from keyfill.cli.args import add_source_options, source_from_args
from keyfill.cli.compact import add_compact_arguments, compact_config, print_compact_result
from keyfill.cli.verify import print_verify_report

__all__ = [
    "main",
    "build_parser",
    "add_compact_arguments",
    "add_source_options",
    "compact_config",
    "print_compact_result",
    "print_verify_report",
    "source_from_args",
]


def _spark_task_error(exc: Exception) -> str | None:
    """The keyfill error raised inside a Spark task: Spark wraps it in its own exception
    with both tracebacks; the user needs the one line that names the object."""
    from compactor.task_errors import raised_in_task

    found = raised_in_task(exc)
    return None if found is None else str(found)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keyfill",
        description="Fast historical backfill: compact a Kafka archive into volume-balanced key "
        "groups once, then replay it in parallel with per-key order and lockstep event time.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument("-v", "--verbose", action="store_const", const=1, dest="verbosity", help="more log lines")
    loud.add_argument("-q", "--quiet", action="store_const", const=-1, dest="verbosity", help="warnings only")
    parser.set_defaults(verbosity=0)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in (
        generate,
        inspect_source,
        plan,
        compact,
        verify,
        replay,
        report,
        handoff,
        versions,
        vacuum,
        jobs,
        warm,
        worker_python,
    ):
        command.add(sub)
    return parser


def _version() -> str:
    from keyfill import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from keyfill.cli.args import log_to_terminal
    from keygroups.errors import KeyfillError

    log_to_terminal(args.verbosity)

    from keygroups import connect_watch

    handle: Callable[[argparse.Namespace], int] = args.handle  # the subcommand's, set by its `add`
    try:
        return handle(args)
    except KeyfillError as exc:
        print(f"keyfill {args.command}: error: {connect_watch.lost() or exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        cause = connect_watch.lost() or _spark_task_error(exc)
        if cause is None:
            raise  # a bug: the traceback is what a report needs
        print(f"keyfill {args.command}: error: {cause}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"keyfill {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
