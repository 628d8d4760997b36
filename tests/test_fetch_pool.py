"""The GET pool starts threads as GETs need them, and still runs `workers` GETs at once."""

from __future__ import annotations

import threading

from reader.fetch_pool import FetchPool
from tests.waits import WAIT_S, wait_until


def test_gets_one_after_another_take_one_thread():
    pool = FetchPool(16)
    try:
        got = []
        for i in range(50):
            got.append(pool.submit(lambda i=i: i * 2).result(timeout=WAIT_S))
            # one after another: the next GET comes once the thread is idle again (the caller
            # hears of a result just before that, and a busy machine may run it first)
            wait_until(lambda: pool._idle._value == 1, "the thread idle again")  # type: ignore[attr-defined]
        assert got == [i * 2 for i in range(50)]
        assert len(pool._threads) == 1
    finally:
        pool.shutdown()


def test_as_many_gets_in_flight_as_workers_and_never_more_threads():
    workers = 8
    pool = FetchPool(workers)
    together = threading.Barrier(workers, timeout=WAIT_S)  # broken unless all 8 wait at once
    try:
        first = [pool.submit(together.wait) for _ in range(workers)]
        assert sorted(f.result(timeout=WAIT_S) for f in first) == list(range(workers))
        more = [pool.submit(lambda i=i: i) for i in range(3 * workers)]
        assert [f.result(timeout=WAIT_S) for f in more] == list(range(3 * workers))
        assert len(pool._threads) == workers
    finally:
        pool.shutdown()
