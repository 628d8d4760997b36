"""Start a throwaway Spark Connect server on 127.0.0.1 for the tests and the benchmarks.

It is pyspark's own (`org.apache.spark.sql.connect.service.SparkConnectServer`, in the
`spark-connect` jar the pyspark wheel ships), submitted with pyspark's `spark-submit` in a
process of its own: a client reaches it only through `sc://127.0.0.1:<port>`, as a notebook
reaches a cluster's, and its driver and executors keep the environment they were started
with, whatever the client's. PySpark will not run a classic session and a Connect session in
one Python process (the choice is process-wide), so a test process that has a classic
session talks to this server from another process.

A cold start takes 25-30 s on two idle cores (a JVM, a SparkContext, the gRPC service):
start one per test session.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field

from keyfill.testing.servers import ScratchServer, free_port, start_retrying

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


@dataclass
class ConnectServer(ScratchServer):
    LOG = "connect-server.log"

    url: str  # sc://127.0.0.1:<port>
    workdir: str
    process: subprocess.Popen[bytes] = field(repr=False)

    def stop(self) -> None:
        if self.process.poll() is None:  # the JVM and the Python workers it started
            try:
                os.killpg(self.process.pid, 9)
            except ProcessLookupError:
                pass
        super().stop()


def spark_submit() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return os.path.join(_find_spark_home(), "bin", "spark-submit")


def _start_once(master: str, conf: Mapping[str, str], env: Mapping[str, str], timeout: float) -> ConnectServer:
    workdir = tempfile.mkdtemp(prefix="keyfill-connect-")
    port = free_port()
    settings = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.enabled": "false",
        "spark.log.level": "WARN",
        **conf,
    }
    args = [spark_submit(), "--class", SERVER_CLASS, "--master", master, "--name", "keyfill-connect"]
    for k, v in settings.items():
        args += ["--conf", f"{k}={v}"]
    with open(os.path.join(workdir, ConnectServer.LOG), "wb") as log:
        proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            env=dict(env),
            start_new_session=True,  # its Python workers go with it
        )
    server = ConnectServer(f"sc://127.0.0.1:{port}", workdir, proc)
    answers = lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close()  # noqa: E731
    server.await_ready(answers, timeout, "Spark Connect")
    return server


def start_connect_server(
    *,
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 240.0,
    tries: int = 2,
) -> ConnectServer:
    """A Spark Connect server on a free loopback port. `env`: the server's environment (its
    executors' too; default: this process's), with PYSPARK_PYTHON this interpreter unless
    given, so its Python workers import what this one does. `conf`: more Spark settings."""
    environ = dict(os.environ if env is None else env)
    environ.setdefault("PYSPARK_PYTHON", sys.executable)
    environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"):
        environ.pop(name, None)  # a server, not another client
    return start_retrying(lambda: _start_once(master, conf or {}, environ, timeout), tries)
