"""A store's SDK client, built in the process that uses it and shared with its sub() stores.

SDK clients (boto3, google-cloud-storage, azure-storage-blob) are thread-safe but hold
sockets and locks, so a pickled store keeps only its settings, and a copy (in a Spark
worker) gets its client when first used: the one this process already made for copies with
the same settings and environment, if any. A client is slow to build
(docs/performance.md#store-clients-built-once-per-process); Spark reuses a Python worker for
many tasks, and each task unpickles its own store.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Any

from keygroups.storage.limits import StoreLimits, environment

_CLIENTS: dict[tuple[Any, ...], Any] = {}  # per process: (kind, settings, limits, environment) -> client
_CLIENTS_LOCK = threading.Lock()


class LazyClient(ABC):
    """Settings of one SDK client; `get()` builds the client once. Subclasses name the
    environment variables their SDK reads (`ENV_PREFIXES`), so a worker whose environment
    differs never reuses another's client, and make the client in `_make`."""

    ENV_PREFIXES: tuple[str, ...] = ()

    def __init__(self, threads: int, *, copied: bool = False) -> None:
        self.threads = threads
        self.copied = copied
        self._client: Any = None
        self._lock = threading.Lock()
        self.limits = StoreLimits.from_env()

    def settings(self) -> tuple[Any, ...]:
        """What a copy needs besides the thread count to build the same client."""
        return ()

    def get(self) -> Any:
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._share_client() if self.copied else self._make()
                client = self._client
        return client

    def _share_client(self) -> Any:
        key = (type(self), self.threads, self.settings(), self.limits, environment(self.ENV_PREFIXES))
        with _CLIENTS_LOCK:
            client = _CLIENTS.get(key)
            if client is None:
                client = _CLIENTS[key] = self._make()
        return client

    @abstractmethod
    def _make(self) -> Any: ...

    def pool_size(self) -> int:
        """Connections to keep: read-ahead keeps more requests in flight than there are threads."""
        return max(10, 2 * self.threads)

    def __getstate__(self) -> dict[str, Any]:
        return {"threads": self.threads, "settings": self.settings()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["threads"], *state["settings"], copied=True)
