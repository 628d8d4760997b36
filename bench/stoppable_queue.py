"""The bounded queue between producer threads and one consumer, with a stop switch.

Producers block while the consumer is behind (backpressure) but must leave when the replay
stops, and an error must still reach the consumer without blocking forever if nobody is
left to read it: `queue.Queue` alone does neither.
"""

from __future__ import annotations

import queue
import threading
from typing import Any


class StoppableQueue:
    def __init__(self, maxsize: int, stop: threading.Event) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=maxsize)
        self._stop = stop

    def put(self, item: Any, *, force: bool = False) -> None:
        """Put, giving up once the stop switch is set (unless `force`: then keep trying until
        it fits or the queue stays full after the stop)."""
        while not self._stop.is_set() or force:
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                if force and self._stop.is_set():
                    return

    def get(self) -> Any:
        return self._queue.get()

    def drain(self) -> None:
        """Empty the queue so producers blocked on it can see the stop switch and leave."""
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return
