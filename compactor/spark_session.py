"""The Spark session a command or job runs on: the one this process runs, else an embedded
one for `keyfill compact` on one machine (spark-submit brings its own), or a Spark Connect
session on a remote cluster (`--remote sc://host:15002`, or `SPARK_REMOTE`)."""

from __future__ import annotations

import logging
import os
import socket
import sys
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from keygroups.connect_watch import EndpointLost, create_watched, watching
from keygroups.errors import KeyfillError
from keygroups.spark_kind import master, set_log_level

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.shell.progress import StageInfo


def local_spark(
    master: str = "local[*]",
    *,
    app: str = "keyfill",
    driver_memory: str = "4g",
    progress: bool = True,
    conf: dict[str, str] | None = None,
    remote: str | None = None,
) -> SparkSession:
    """A local SparkSession whose Python workers run this interpreter (else they may start
    another Python that lacks keyfill and fail to connect back). `conf`: more settings (a
    benchmark's event log). `remote`: a Spark Connect session on that server instead
    (`sc://host:port`, or `local[...]` for one started in this process), whose driver and
    executors are the server's: only `conf` applies to it."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise KeyfillError(
            "this command runs Spark on this machine: pip install 'keyfill[spark]' (or run the job with "
            "spark-submit on a cluster that has Spark, see docs/deploy.md)"
        ) from None

    builder = SparkSession.builder
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    if remote is not None:
        return connect_session(builder, remote, app, progress=progress)
    return (
        builder.master(master)
        .appName(app)
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", str(progress).lower())
        .config("spark.sql.shuffle.partitions", "16")
        .getOrCreate()
    )


def connect_session(builder: SparkSession.Builder, remote: str, app: str, *, progress: bool = True) -> SparkSession:
    """A Spark Connect session on `remote`, or one line saying why not (the client's
    packages, or a server that does not answer). `progress`: the running job's stages on a
    terminal's stderr, as a classic session's console progress bar shows them."""
    try:
        import grpc  # noqa: F401 - the Connect client's transport
    except ImportError:
        raise KeyfillError(
            f"--remote {remote}: the Spark Connect client needs grpcio, grpcio-status and zstandard: "
            "pip install 'keyfill[connect]'"
        ) from None
    if remote.startswith("sc://"):
        _answers(remote)
    try:
        spark = create_watched(builder.remote(remote).appName(app).getOrCreate, remote)
    except EndpointLost:
        raise
    except Exception as exc:  # pyspark's errors carry the gRPC status in many lines
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise KeyfillError(f"--remote {remote}: no Spark Connect session: {first}") from exc
    if progress and sys.stderr.isatty():
        # pyspark types the handler as its ProgressHandler ABC, yet documents and calls any callable
        # of that signature (its own example passes a function); subclassing it here would import the
        # Connect client's protobuf modules with this one.
        spark.registerProgressHandler(_StageProgress())  # type: ignore[arg-type]
    return spark


class _StageProgress:
    """A Connect job's stages on one line of stderr, redrawn as the server reports them (the
    Connect client's own bar is off by default and writes to stdout, where `--json` goes)."""

    def __call__(
        self,
        stages: Iterable[StageInfo] | None = None,
        inflight_tasks: int = 0,
        operation_id: str | None = None,
        done: bool = False,
        **_: object,
    ) -> None:
        running = [st for st in stages or () if not st.done] if not done else []
        if not running:
            sys.stderr.write("\r\033[K")
        else:
            st = running[0]
            sys.stderr.write(
                f"\r\033[K[Stage {st.stage_id}: ({st.num_completed_tasks} + {inflight_tasks}) / {st.num_tasks}]"
            )
        sys.stderr.flush()


CONNECT_PORT = 15002  # a Spark Connect URL's port when it names none
ANSWER_S = 10.0


def _answers(remote: str) -> None:
    """Fail in seconds when nothing listens at the URL's host and port: the Connect client
    retries an unanswered call for about ten minutes before it gives up."""
    parsed = urllib.parse.urlparse("http" + remote[2:])  # as pyspark parses it: sc://host:port/;params
    host, port = parsed.hostname or "localhost", parsed.port or CONNECT_PORT
    try:
        socket.create_connection((host, port), timeout=ANSWER_S).close()
    except OSError as exc:
        raise KeyfillError(f"--remote {remote}: no Spark Connect server answers at {host}:{port} ({exc})") from None


def embedded_spark(
    master: str | None,
    *,
    app: str,
    driver_memory: str = "4g",
    progress: bool = True,
    log_level: str = "WARN",
    remote: str | None = None,
) -> AbstractContextManager[SparkSession]:
    """The session a command runs on: this process's (see `running_or_started`), else a
    local one on `master` (default local[*]), or a Spark Connect one on `remote`."""

    def start() -> SparkSession:
        spark = local_spark(
            master or "local[*]", app=app, driver_memory=driver_memory, progress=progress, remote=remote
        )
        set_log_level(spark, log_level)
        return spark

    return running_or_started(start, app, remote)


def from_builder(builder: SparkSession.Builder) -> SparkSession:
    """`builder.getOrCreate()` for a job script: under SPARK_REMOTE a Connect session,
    whose creation is bounded as `--remote`'s is (`keygroups.connect_watch.create_watched`)."""
    return create_watched(builder.getOrCreate, os.environ.get("SPARK_REMOTE"), "SPARK_REMOTE=")


def session_arguments(master: str | None, remote: str | None) -> tuple[str | None, str | None]:
    """`--master` and `--remote` as a command was given them, `SPARK_REMOTE` standing in for
    `--remote`: one of the two (a Connect client cannot choose the server's master)."""
    given = "--remote"
    if remote is None and os.environ.get("SPARK_REMOTE"):
        remote, given = os.environ["SPARK_REMOTE"], "SPARK_REMOTE"
    if master is not None and remote is not None:
        raise KeyfillError(
            f"--master {master} and {given}={remote} both given: --master starts Spark on this machine, "
            "--remote runs on a Spark Connect server, whose master is its own; give one"
        )
    return master, remote


@contextmanager
def running_or_started(
    start: Callable[[], SparkSession], app: str, remote: str | None = None
) -> Iterator[SparkSession]:
    """The Spark session this process already runs (a notebook, a pyspark shell, a driver
    program calling `keyfill.cli.main` or a job's `main()`), left running as it was:
    stopping it would end the caller's work. Else the one `start()` makes, stopped after,
    and watched while it runs when it is a Spark Connect one (`remote`, else SPARK_REMOTE:
    `keygroups.connect_watch`)."""
    active = _active_session()
    if active is not None:
        log = logging.getLogger("keyfill")
        log.info("%s runs on this process's Spark session (%s)", app, master(active))
        yield active
        return
    spark = start()
    try:
        with watching(spark, remote or os.environ.get("SPARK_REMOTE")):
            yield spark
    finally:
        spark.stop()


def _active_session() -> SparkSession | None:
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return None  # local_spark says what to install
    return SparkSession.getActiveSession()
