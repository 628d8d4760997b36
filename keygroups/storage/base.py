"""The storage contract every backend keeps, and the key rules that make a key mean the
same thing on all of them."""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from keygroups.errors import InvalidKey, ObjectExists, ObjectNotFound, StorageError


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    modified_ms: int = field(default=0, compare=False)  # last modified, epoch ms (vacuum judges age by it)


# Temp files of in-flight local writes start with this; list() hides them and keys may not
# use it, so a crashed writer's leftovers can never be mistaken for data.
TMP_PREFIX = ".keyfill-tmp-"


def check_key(key: str) -> str:
    """Reject keys that would escape the root locally or mean different things per backend."""
    if not isinstance(key, str) or not key:
        raise InvalidKey(f"invalid storage key {key!r}: must be a non-empty string")
    _check_segments(key, key.split("/"))
    return key


def _check_segments(what: str, parts: list[str]) -> None:
    for part in parts:
        if part in ("", ".", "..") or part.startswith(TMP_PREFIX) or "\x00" in part:
            raise InvalidKey(
                f"invalid storage key {what!r}: segments may not be empty, '.', '..', "
                f"contain NUL or start with {TMP_PREFIX!r}"
            )


def check_prefix(prefix: str) -> str:
    """A prefix is a plain string prefix (like S3); only its folder part must be a valid key."""
    if prefix.startswith("/"):
        raise InvalidKey(f"invalid storage prefix {prefix!r}: must be relative")
    folder = prefix.rpartition("/")[0]
    if folder:
        check_key(folder)
    return prefix


def _join(root: str, key: str) -> str:
    if not key:
        return root
    return f"{root}/{key}" if not root.endswith("/") else root + key


class Storage(ABC):
    """A flat namespace of immutable-until-replaced objects under one root URL."""

    url: str

    @abstractmethod
    def read(self, key: str) -> bytes: ...

    @abstractmethod
    def read_range(self, key: str, start: int, length: int) -> bytes:
        """Bytes [start, start+length); fewer (possibly none) at end of object."""

    @abstractmethod
    def write(self, key: str, data: bytes) -> None:
        """Replace the object atomically: readers see the old or the new bytes, never a mix."""

    @abstractmethod
    def write_after(self, key: str, base: str, data: bytes) -> None:
        """Write `key` as the bytes of the existing object `base` followed by `data`,
        atomically like `write`, without passing `base` through this process where the
        backend can copy it itself (S3 UploadPartCopy, an in-kernel copy locally): how an
        append continues a segment file. ObjectNotFound names `base` when it is missing."""

    @abstractmethod
    def create(self, key: str, data: bytes) -> None:
        """Write the object only if no object has the key, atomically: of writers racing
        for one key exactly one succeeds, the others get ObjectExists. What versioned
        commits are built on (S3 conditional writes, `If-None-Match: *`; a hard link
        locally). A create of the very bytes the object already holds succeeds: that is
        a retried create whose first attempt landed (`_created_by_us`)."""

    def _created_by_us(self, key: str, data: bytes) -> bool:
        """After a create-only write was refused: whether the object holds exactly our bytes.
        An SDK retries a write whose answer was lost; the retry then finds the object its
        first attempt made and is refused. Reporting that as another writer's win would
        tell a committed version it failed. Callers create unique bytes (a run id inside)."""
        try:
            return self.read(key) == bytes(data)
        except ObjectNotFound:
            return False

    @abstractmethod
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """All objects whose key starts with ``prefix`` (a string prefix, like S3), sorted."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def size(self, key: str) -> int: ...

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; a missing key is not an error, so retries are safe."""

    @abstractmethod
    def delete_many(self, keys: builtins.list[str]) -> int:
        """Remove exactly these objects (missing ones are not an error); returns how many
        keys were given."""

    def delete_prefix(self, prefix: str) -> int:
        """Remove every object under ``prefix``; returns how many were removed."""
        return self.delete_many([o.key for o in self.list(prefix)])

    @abstractmethod
    def sub(self, prefix: str) -> Storage:
        """A store rooted at ``root/prefix`` that shares this one's connections."""

    @abstractmethod
    def location(self) -> tuple[str, ...]:
        """Where the root is, as path segments after a backend tag: equal prefixes mean one
        root lies inside the other."""

    def url_for(self, key: str) -> str:
        return _join(self.url, key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    @staticmethod
    def _check_range(start: int, length: int) -> None:
        if start < 0 or length < 0:
            raise InvalidKey(f"invalid byte range start={start} length={length}")


class ObjectStore(Storage):
    """What the object stores (S3, GCS, Azure) share: keys under a prefix of a bucket or
    container, an SDK client built where it is used (`_client`: a `LazyClient`), and a
    metadata lookup that answers None for a missing object, beside `_missing`, which tells a
    missing object from a missing bucket (a bare 404 is the same for both)."""

    prefix: str
    _client: Any

    @property
    def client(self) -> Any:
        return self._client.get()

    def _name(self, key: str) -> str:
        """The key's full object name in the bucket."""
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _create_refused(self, key: str, data: bytes) -> None:
        """A create-only write was refused because the object exists: return when it holds
        our bytes (a retried create whose first attempt landed), else raise ObjectExists."""
        if not self._created_by_us(key, data):
            raise ObjectExists(f"{self.url_for(key)} exists already (another writer created it)") from None

    def read_range(self, key: str, start: int, length: int) -> bytes:
        self._check_range(start, length)
        if length == 0:
            self.size(key)  # still report a missing object
            return b""
        try:
            return self._get_range(key, start, length)
        except StorageError as e:
            if self._past_end(e.__cause__):  # a start at or past the end: no bytes, as locally
                return b""
            raise

    @abstractmethod
    def _get_range(self, key: str, start: int, length: int) -> bytes:
        """Bytes [start, start+length) in one ranged GET (length > 0), errors translated."""

    @abstractmethod
    def _past_end(self, cause: BaseException | None) -> bool:
        """Whether the SDK error behind a failed ranged GET means the range starts past the end."""

    @abstractmethod
    def _stat(self, key: str) -> int | None:
        """The object's size, or None when there is no such object."""

    @abstractmethod
    def _missing(self, key: str) -> StorageError:
        """The error for a key found missing: ObjectNotFound, or a StorageError naming the
        bucket when that is what's missing."""

    def exists(self, key: str) -> bool:
        if self._stat(key) is not None:
            return True
        missing = self._missing(key)
        if not isinstance(missing, ObjectNotFound):
            raise missing
        return False

    def size(self, key: str) -> int:
        size = self._stat(key)
        if size is None:
            raise self._missing(key)
        return size
