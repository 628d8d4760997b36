"""Local folders as object storage: atomic writes by temp file and rename."""

from __future__ import annotations

import builtins
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import BinaryIO

from keygroups.errors import ObjectExists, ObjectNotFound, StorageError
from keygroups.storage.base import TMP_PREFIX, ObjectInfo, Storage, check_key, check_prefix


class LocalStorage(Storage):
    """A directory tree. Picklable as-is: it holds nothing but its absolute root path.

    Unlike S3, a key cannot be both an object and a folder ('a' and 'a/b'): the second
    write fails with a StorageError.
    """

    def __init__(self, root: str, *, fsync: bool = True) -> None:
        self.root = os.path.abspath(root)
        self.url = self.root
        self.fsync = fsync

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *check_key(key).split("/"))

    def location(self) -> tuple[str, ...]:
        # realpath: a symlinked folder is the same place under two names.
        return ("file", *[p for p in os.path.realpath(self.root).split(os.sep) if p])

    @contextmanager
    def _errors(self, key: str, verb: str) -> Iterator[None]:
        try:
            yield
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            if verb == "write":
                raise StorageError(f"cannot write {self.url_for(key)}: {e.strerror}") from e
            raise ObjectNotFound(self.url_for(key)) from e
        except OSError as e:
            raise StorageError(f"cannot {verb} {self.url_for(key)}: {e.strerror or e}") from e

    def read(self, key: str) -> bytes:
        path = self._path(key)
        with self._errors(key, "read"), open(path, "rb") as f:
            return f.read()

    def read_range(self, key: str, start: int, length: int) -> bytes:
        self._check_range(start, length)
        path = self._path(key)
        with self._errors(key, "read"), open(path, "rb") as f:
            f.seek(start)
            return f.read(length)

    def write(self, key: str, data: bytes) -> None:
        self._publish(key, data, os.replace)

    def write_after(self, key: str, base: str, data: bytes) -> None:
        source = self._path(base)
        with self._errors(base, "read"):
            src = open(source, "rb")  # noqa: SIM115 - closed below, after the copy
        with src:
            # copyfileobj would pass every byte through Python; sendfile copies in the kernel
            size = os.fstat(src.fileno()).st_size
            self._publish(key, data, os.replace, lambda f: _copy_all(src, f, size))

    def create(self, key: str, data: bytes) -> None:
        def link(tmp: str, path: str) -> None:
            try:
                os.link(tmp, path)  # fails if the path exists: the filesystem picks one winner
            except FileExistsError:
                if self._created_by_us(key, data):
                    os.unlink(tmp)
                    return
                raise ObjectExists(f"{self.url_for(key)} exists already (another writer created it)") from None
            os.unlink(tmp)

        self._publish(key, data, link)

    def _publish(
        self, key: str, data: bytes, place: Callable[[str, str], None], head: Callable[[BinaryIO], None] | None = None
    ) -> None:
        """Write a temp file beside the key (`head` first writes what precedes `data`), then
        `place` it under the key's name."""
        path = self._path(key)
        folder = os.path.dirname(path)
        with self._errors(key, "write"):
            # A concurrent delete_prefix may prune the folder between makedirs and open.
            for attempt in range(3):
                os.makedirs(folder, exist_ok=True)
                tmp = os.path.join(folder, f"{TMP_PREFIX}{uuid.uuid4().hex}")
                try:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
                    break
                except FileNotFoundError:
                    if attempt == 2:
                        raise
            try:
                with open(fd, "wb") as f:
                    if head is not None:
                        head(f)
                    f.write(data)
                    if self.fsync:
                        # Without it a crash can leave the renamed file empty: a manifest
                        # that points at nothing is worse than no manifest.
                        f.flush()
                        os.fsync(f.fileno())
                place(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(prefix)
        out: list[ObjectInfo] = []

        def walk(folder: str, rel: str) -> None:
            try:
                entries = list(os.scandir(folder))
            except (FileNotFoundError, NotADirectoryError):
                return
            for entry in entries:
                key = rel + entry.name
                try:
                    if entry.is_dir():
                        if (key + "/").startswith(prefix) or prefix.startswith(key + "/"):
                            walk(entry.path, key + "/")
                    elif not entry.name.startswith(TMP_PREFIX) and key.startswith(prefix):
                        st = entry.stat()
                        out.append(ObjectInfo(key, st.st_size, st.st_mtime_ns // 1_000_000))
                except FileNotFoundError:  # deleted while we were looking
                    continue

        base = prefix.rpartition("/")[0]
        with self._errors(prefix, "list"):
            walk(os.path.join(self.root, *base.split("/")) if base else self.root, base + "/" if base else "")
        out.sort(key=lambda o: o.key)
        return out

    def exists(self, key: str) -> bool:
        return os.path.isfile(self._path(key))

    def size(self, key: str) -> int:
        path = self._path(key)
        with self._errors(key, "stat"):
            if os.path.isdir(path):
                raise FileNotFoundError(2, "is a folder, not an object")
            return os.stat(path).st_size

    def _inside(self, key: str) -> str:
        """The key's path, refused if a symlinked folder takes it outside the root: deleting
        it would reach other data (an archive's slices/ linked elsewhere)."""
        path = self._path(key)
        real_root = os.path.realpath(self.root)
        folder = os.path.realpath(os.path.dirname(path))
        if folder != real_root and not folder.startswith(real_root + os.sep):
            raise StorageError(f"refusing to delete {self.url_for(key)}: it lies outside {self.url} through a link")
        return path

    def delete(self, key: str) -> None:
        path = self._inside(key)
        with self._errors(key, "delete"):
            try:
                os.unlink(path)
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                pass  # no such object (a folder is not one): nothing to do, as on S3

    def delete_many(self, keys: builtins.list[str]) -> int:
        folders: set[str] = set()
        for key in keys:  # all checked before any is deleted
            self._inside(key)
        for key in keys:
            self.delete(key)
            folders.add(os.path.dirname(self._path(key)))
        # Prune folders left empty, so a deleted prefix looks gone as it does on S3.
        for folder in sorted(folders, key=len, reverse=True):
            while folder != self.root and folder.startswith(self.root + os.sep):
                try:
                    os.rmdir(folder)
                except OSError:
                    break
                folder = os.path.dirname(folder)
        return len(keys)

    def sub(self, prefix: str) -> LocalStorage:
        prefix = prefix.strip("/")
        if not prefix:
            return self
        return LocalStorage(self._path(prefix), fsync=self.fsync)


def _copy_all(src: BinaryIO, dst: BinaryIO, size: int) -> None:
    """All `size` bytes of file `src` to the end of file `dst`, in the kernel."""
    dst.flush()
    out, done = dst.fileno(), 0
    while done < size:
        sent = os.sendfile(out, src.fileno(), done, size - done)
        if sent == 0:
            raise StorageError(f"{src.name}: ended after {done} of {size} bytes while being copied")
        done += sent
    os.lseek(out, 0, os.SEEK_END)
