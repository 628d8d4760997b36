"""A Spark Connect client in a process of its own, for the tests: the `connect` fixture
(tests/conftest.py) starts one per test session and runs functions in it. PySpark refuses a
classic and a Connect session in one process, and the test process runs a classic one; so
what a test does over Connect is a module-level function `f(spark, ...)`, the same one its
classic twin calls with the classic session, called there by reference, its arguments and
result crossing between the processes pickled."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

# Every test that asks for the Connect server or client: `--dist loadgroup` runs them in one
# xdist worker, so one server serves the run.
CONNECT = pytest.mark.xdist_group("connect")

_session: Any = None
TIMEOUT_S = 600


class Client:
    def __init__(self, url: str) -> None:
        self.url = url
        self.pool = ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn"), initializer=_connect, initargs=(url,)
        )

    def run(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(session, *args)` in the client process."""
        return self.pool.submit(_with_session, function, *args).result(timeout=TIMEOUT_S)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(cancel_futures=True)


def _connect(url: str) -> None:
    """The process's Connect session, as the testing kit's `keyfill_spark` fixture makes it
    under SPARK_REMOTE (format("keyfill") registered)."""
    global _session
    os.environ["SPARK_REMOTE"] = url
    from keyfill.testing.pytest_plugin import spark_session

    _session = spark_session()


def _with_session(function: Callable[..., Any], *args: Any) -> Any:
    return function(_session, *args)
