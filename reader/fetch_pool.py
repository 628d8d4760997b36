"""A pool of daemon threads for GETs that a stopped replay can abandon.

Written by hand because `concurrent.futures.ThreadPoolExecutor` joins its (non-daemon)
threads when the interpreter exits: a GET stuck on a frozen endpoint would then hold a
Ctrl-C'd replay open until the read timeout. These threads are daemons, and `shutdown`
cancels what has not started and returns at once; a GET in flight finishes (or times
out) on its own and its result is dropped.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

# GETs in flight at once for one reader (a replay, or a Spark task), at most: reader threads
# decode (CPU), and even a few of them need many GETs in flight to hide an object store's
# latency.
GET_THREADS = 16

_STOP = object()
_T = TypeVar("_T")


class FetchPool:
    def __init__(self, workers: int, name: str = "keyfill-read") -> None:
        self._tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()  # (future, fn, args), or _STOP
        self._closed = False
        self._lock = threading.Lock()
        self._workers, self._name = max(1, workers), name
        self._threads: list[threading.Thread] = []
        # A thread is started only when a GET finds none idle (as ThreadPoolExecutor does): a
        # small archive's replay needs one or two, and starting 16 per replay, each start
        # waiting for the new thread to run, was what a busy host made slow.
        self._idle = threading.Semaphore(0)

    def submit(self, fn: Callable[..., _T], *args: Any) -> Future[_T]:
        future: Future[_T] = Future()
        with self._lock:
            if self._closed:
                future.cancel()
                return future
            self._tasks.put((future, fn, args))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._workers:
                thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while True:
            item = self._tasks.get()
            if item is _STOP:
                return
            future, fn, args = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # handed to whoever waits on the future
                    future.set_exception(exc)
            # An idle thread must not keep its last GET's bytes alive (through the future)
            # while it waits for the next: 16 threads x a 16 MiB part, outside the read budget.
            del item, future, fn, args
            self._idle.release()

    def shutdown(self) -> None:
        """Cancel queued work and let the threads end; never waits for a GET in flight."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        while True:
            try:
                item = self._tasks.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                item[0].cancel()
        for _ in self._threads:
            self._tasks.put(_STOP)
