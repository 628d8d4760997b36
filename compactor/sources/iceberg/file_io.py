"""pyiceberg's FileIO over keyfill's storage layer, for tables on GCS and Azure: the metadata,
manifests and data files are read with the credentials and endpoints keyfill already
resolves (GOOGLE_APPLICATION_CREDENTIALS, STORAGE_EMULATOR_HOST, AZURE_STORAGE_CONNECTION_STRING,
...), as the rest of a compaction reads and writes them.

Written by hand because pyiceberg's own GCS and Azure file systems (pyarrow's) read none of
those settings, and pyarrow has no file system over a Python object store: a small
`FileSystemHandler` does (ranged reads for Parquet footers and column chunks, whole-object
writes for the tests' own tables).
"""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
from pyarrow import fs as pafs
from pyiceberg.io.pyarrow import PyArrowFileIO

from keygroups.errors import ObjectNotFound
from keygroups.storage import Storage, open_storage

# Locations this FileIO reads through keyfill's storage; others (local, S3) stay pyarrow's.
SCHEMES = ("gs", "gcs", "az", "abfs", "abfss", "wasb", "wasbs")
READ_AHEAD = 1 << 20  # bytes a ranged read asks for at least (a footer, a column chunk)


class StoreFileIO(PyArrowFileIO):
    """PyArrowFileIO whose GCS and Azure file systems are keyfill's stores (pyiceberg's
    ArrowScan reads through a PyArrowFileIO's file systems, so this is a subclass)."""

    def _initialize_fs(self, scheme: str, netloc: str | None = None) -> pafs.FileSystem:
        if scheme in SCHEMES:
            return pafs.PyFileSystem(StoreHandler(open_storage(f"{scheme}://{netloc}/"), f"{netloc}/"))
        return super()._initialize_fs(scheme, netloc)


class _RangedReader(io.RawIOBase):
    """An object read by ranges as a seekable file."""

    def __init__(self, store: Storage, key: str, size: int):
        self.store, self.key, self.size, self.at = store, key, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.at, io.SEEK_END: self.size}[whence]
        self.at = max(0, base + offset)
        return self.at

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.size - self.at)
        if n <= 0:
            return 0
        data = self.store.read_range(self.key, self.at, n)
        buffer[: len(data)] = data
        self.at += len(data)
        return len(data)


class _WrittenOnClose(io.BytesIO):
    """An object written whole when its stream is closed (a manifest, a data file)."""

    def __init__(self, store: Storage, key: str):
        super().__init__()
        self.store, self.key = store, key

    def close(self) -> None:
        if not self.closed:
            self.store.write(self.key, self.getvalue())
        super().close()


class StoreHandler(pafs.FileSystemHandler):  # type: ignore[misc]  # pyarrow ships no stubs
    """A pyarrow file system over one bucket or container of keyfill's storage; pyiceberg
    names files as `<bucket>/<key>` (its path of a location)."""

    def __init__(self, store: Storage, prefix: str):
        self.store, self.prefix = store, prefix

    def _key(self, path: str) -> str:
        return path.removeprefix(self.prefix)

    def get_type_name(self) -> str:
        return "keyfill-store"

    def normalize_path(self, path: str) -> str:
        return path

    def equals(self, other: Any) -> bool:
        return isinstance(other, StoreHandler) and other.store.url == self.store.url

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        infos = []
        for path in paths:
            try:
                infos.append(pafs.FileInfo(path, pafs.FileType.File, size=self.store.size(self._key(path))))
            except ObjectNotFound:
                infos.append(pafs.FileInfo(path, pafs.FileType.NotFound))
        return infos

    def open_input_file(self, path: str) -> pa.NativeFile:
        key = self._key(path)
        try:
            size = self.store.size(key)
        except ObjectNotFound:
            raise FileNotFoundError(self.store.url_for(key)) from None
        return pa.PythonFile(io.BufferedReader(_RangedReader(self.store, key, size), READ_AHEAD), mode="r")

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any = None) -> pa.NativeFile:
        return pa.PythonFile(_WrittenOnClose(self.store, self._key(path)), mode="w")

    def delete_file(self, path: str) -> None:
        self.store.delete(self._key(path))

    def create_dir(self, path: str, recursive: bool) -> None:
        pass  # object stores have no folders

    def _unsupported(self, *args: Any) -> Any:
        raise NotImplementedError("keyfill's Iceberg file system reads tables and writes whole files only")

    get_file_info_selector = delete_dir = delete_dir_contents = delete_root_dir_contents = _unsupported
    move = copy_file = open_append_stream = _unsupported
