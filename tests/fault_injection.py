"""A compaction that dies partway through its rewrite, injected from outside the product: the
run is given a destination store that fails once a rewrite task has written some segment
files. The store travels to Spark's Python workers inside the rewrite task's closure, so the
failure happens where a real one would, after the files are on storage and before any
commit.

This module is pickled by value (cloudpickle), so the workers need not import `tests`."""

from __future__ import annotations

import sys

from pyspark import cloudpickle

from compactor.config import CompactConfig, CompactResult
from compactor.job import compact, prepare
from keygroups import compacted
from keygroups.storage import ObjectInfo, Storage

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class InjectedFailure(RuntimeError):
    pass


class DiesAfterSegmentFiles(Storage):
    """`inner`, except that a copy of it (each task unpickles its own) raises InjectedFailure
    right after it has written its `files`-th segment file."""

    def __init__(self, inner: Storage, files: int) -> None:
        self.inner, self.files, self.written = inner, files, 0
        self.url = inner.url

    def _wrote(self, key: str) -> None:
        if key.startswith(compacted.GROUPS + "/") and key.endswith(".avro"):
            self.written += 1
            if self.written >= self.files:
                raise InjectedFailure(f"injected failure after {self.written} segment files ({key})")

    def write(self, key: str, data: bytes) -> None:
        self.inner.write(key, data)
        self._wrote(key)

    def write_after(self, key: str, base: str, data: bytes) -> None:
        self.inner.write_after(key, base, data)
        self._wrote(key)

    def read(self, key: str) -> bytes:
        return self.inner.read(key)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        return self.inner.read_range(key, start, length)

    def create(self, key: str, data: bytes) -> None:
        self.inner.create(key, data)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        return self.inner.list(prefix)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def delete_many(self, keys: list[str]) -> int:
        return self.inner.delete_many(keys)

    def sub(self, prefix: str) -> Storage:
        return self.inner.sub(prefix)

    def location(self) -> tuple[str, ...]:
        return self.inner.location()


def compact_dying_after(cfg: CompactConfig, spark, files: int = 1) -> CompactResult:
    """`compact(cfg, spark)`, whose rewrite tasks die once each has written `files` segment
    files: the run's destination (`prepare`'s) is swapped for a store that fails then."""
    prepared = prepare(cfg)
    prepared.dest = DiesAfterSegmentFiles(prepared.dest, files)
    return compact(cfg, spark, prepared)
