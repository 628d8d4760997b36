"""Object storage shared by every keyfill component: local paths and S3, chosen by URL.

Keys are '/'-separated and relative to a store's root URL. Both backends give the same
contract (atomic writes, sorted recursive listings, ``ObjectNotFound`` for missing keys), so
archive code is written once and tested on both. Every error names the full URL at fault,
because a backfill touches thousands of objects and "file not found" alone is useless.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from keygroups.errors import InvalidKey, ObjectNotFound, StorageError

__all__ = [
    "StorageError",
    "ObjectNotFound",
    "ObjectInfo",
    "Storage",
    "LocalStorage",
    "S3Storage",
    "S3Limits",
    "open_storage",
    "overlapping",
]


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# Temp files of in-flight local writes start with this; list() hides them and keys may not
# use it, so a crashed writer's leftovers can never be mistaken for data.
_TMP = ".keyfill-tmp-"


def _check_key(key: str) -> str:
    """Reject keys that would escape the root locally or mean different things per backend."""
    if not isinstance(key, str) or not key:
        raise InvalidKey(f"invalid storage key {key!r}: must be a non-empty string")
    _check_segments(key, key.split("/"))
    return key


def _check_segments(what: str, parts: list[str]) -> None:
    for part in parts:
        if part in ("", ".", "..") or part.startswith(_TMP) or "\x00" in part:
            raise InvalidKey(
                f"invalid storage key {what!r}: segments may not be empty, '.', '..', "
                f"contain NUL or start with {_TMP!r}"
            )


def _check_prefix(prefix: str) -> str:
    """A prefix is a plain string prefix (like S3); only its folder part must be a valid key."""
    if prefix.startswith("/"):
        raise InvalidKey(f"invalid storage prefix {prefix!r}: must be relative")
    folder = prefix.rpartition("/")[0]
    if folder:
        _check_key(folder)
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
    def delete_many(self, keys: list[str]) -> int:
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


# --------------------------------------------------------------------------- local


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
        return os.path.join(self.root, *_check_key(key).split("/"))

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
            raise ObjectNotFound(f"no such object: {self.url_for(key)}") from e
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
        path = self._path(key)
        folder = os.path.dirname(path)
        with self._errors(key, "write"):
            # A concurrent delete_prefix may prune the folder between makedirs and open.
            for attempt in range(3):
                os.makedirs(folder, exist_ok=True)
                tmp = os.path.join(folder, f"{_TMP}{uuid.uuid4().hex}")
                try:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
                    break
                except FileNotFoundError:
                    if attempt == 2:
                        raise
            try:
                with open(fd, "wb") as f:
                    f.write(data)
                    if self.fsync:
                        # Without it a crash can leave the renamed file empty: a manifest
                        # that points at nothing is worse than no manifest.
                        f.flush()
                        os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        _check_prefix(prefix)
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
                    elif not entry.name.startswith(_TMP) and key.startswith(prefix):
                        out.append(ObjectInfo(key, entry.stat().st_size))
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

    def delete(self, key: str) -> None:
        path = self._path(key)
        with self._errors(key, "delete"):
            try:
                os.unlink(path)
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                pass  # no such object (a folder is not one): nothing to do, as on S3

    def delete_many(self, keys: list[str]) -> int:
        folders: set[str] = set()
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


# --------------------------------------------------------------------------- S3


@dataclass(frozen=True)
class S3Limits:
    """How long one S3 request may wait, so a frozen endpoint fails a job in about a
    minute instead of hanging it (botocore's defaults, 60 s reads and up to 10 attempts,
    add up to ten minutes and more).

    botocore has no standard variable for its timeouts, so these come from
    ``KEYFILL_S3_CONNECT_TIMEOUT``, ``KEYFILL_S3_READ_TIMEOUT`` and ``KEYFILL_S3_DEADLINE``
    (seconds); attempts and retry mode come from the standard ``AWS_MAX_ATTEMPTS`` /
    ``AWS_RETRY_MODE`` or the AWS config file. The read timeout bounds each wait for bytes,
    not a whole transfer, so large GETs are not cut short.
    """

    connect_s: float = 5.0
    read_s: float = 20.0
    deadline_s: float = 60.0  # no retry starts that could not finish within this

    ENV = {
        "connect_s": "KEYFILL_S3_CONNECT_TIMEOUT",
        "read_s": "KEYFILL_S3_READ_TIMEOUT",
        "deadline_s": "KEYFILL_S3_DEADLINE",
    }

    @classmethod
    def from_env(cls) -> S3Limits:
        values: dict[str, float] = {}
        for name, var in cls.ENV.items():
            raw = os.environ.get(var)
            if raw is None or not raw.strip():
                continue
            try:
                values[name] = float(raw)
            except ValueError:
                raise StorageError(f"{var}={raw!r}: expected a number of seconds") from None
            if not values[name] > 0:
                raise StorageError(f"{var}={raw!r}: must be more than 0 seconds")
        return cls(**values)


DEFAULT_MAX_ATTEMPTS = 5


def _deadline_hooks(events: Any, limits: S3Limits) -> None:
    """Give every S3 request a total deadline across botocore's retries.

    botocore bounds each attempt (timeouts) and the number of attempts, but not their sum;
    a hook before each send refuses a retry that could not finish in time, naming the last
    error, and the request fails with that instead of waiting out every attempt.
    """
    from botocore.exceptions import BotoCoreError

    class DeadlineExceeded(BotoCoreError):
        fmt = "gave up after {elapsed:.0f} s and {attempts} attempt(s) on endpoint {endpoint}: {last}"

    def before_send(request: Any, **_: Any) -> None:
        ctx = request.context
        now = time.monotonic()
        started = ctx.setdefault("keyfill_started", now)
        attempt = ctx.get("retries", {}).get("attempt", 1)
        if attempt > 1 and now - started + limits.read_s > limits.deadline_s:
            endpoint = urlparse(request.url)
            raise DeadlineExceeded(
                elapsed=now - started,
                attempts=attempt - 1,
                endpoint=f"{endpoint.scheme}://{endpoint.netloc}",
                last=ctx.get("keyfill_last_error", "no answer"),
            )

    def needs_retry(request_dict: Any, response: Any = None, caught_exception: Any = None, **_: Any) -> None:
        if caught_exception is not None:
            request_dict["context"]["keyfill_last_error"] = str(caught_exception)
        elif response is not None:
            err = response[1].get("Error", {}) if isinstance(response[1], dict) else {}
            if err:
                request_dict["context"]["keyfill_last_error"] = f"{err.get('Code')} {err.get('Message', '')}".strip()
        return None  # the decision stays botocore's

    events.register_first("before-send.s3", before_send)
    events.register_first("needs-retry.s3", needs_retry)


class _S3Client:
    """One boto3 client, created on first use and shared by a store and its sub() stores.

    boto3 clients are thread-safe but hold sockets and locks, so pickling keeps only the
    settings and the copy (in a Spark worker) builds its own client when first used.
    """

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._client: Any = None
        self._lock = threading.Lock()
        self.limits = S3Limits.from_env()

    def get(self) -> Any:
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make()
                client = self._client
        return client

    def _make(self) -> Any:
        import boto3
        import botocore.session
        from botocore.config import Config

        # Endpoint (AWS_ENDPOINT_URL[_S3]), credentials and profile come from botocore's
        # usual chain; we only fill in what it would otherwise get wrong for us.
        core = botocore.session.get_session()
        mode = core.get_config_variable("retry_mode")
        config = Config(
            region_name=core.get_config_variable("region") or "us-east-1",
            retries={
                # 'legacy' (botocore's default) gives up after 4 attempts on throttling.
                "mode": mode if mode in ("standard", "adaptive") else "standard",
                "total_max_attempts": core.get_config_variable("max_attempts") or DEFAULT_MAX_ATTEMPTS,
            },
            connect_timeout=self.limits.connect_s,
            read_timeout=self.limits.read_s,
            # Read-ahead keeps more GETs in flight than there are threads.
            max_pool_connections=max(10, 2 * self.threads),
        )
        client = boto3.session.Session(botocore_session=core).client("s3", config=config)
        _deadline_hooks(client.meta.events, self.limits)
        return client

    def __getstate__(self) -> dict[str, Any]:
        return {"threads": self.threads}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["threads"])


class S3Storage(Storage):
    """Objects under ``s3://bucket/prefix``. PUT is atomic on S3, so no temp objects."""

    def __init__(self, bucket: str, prefix: str = "", *, threads: int = 16, client: _S3Client | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client = client or _S3Client(threads)

    @property
    def client(self) -> Any:
        return self._client.get()

    def location(self) -> tuple[str, ...]:
        return ("s3", self.bucket, *[p for p in self.prefix.split("/") if p])

    def _key(self, key: str) -> str:
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _translate(self, exc: Exception, key: str) -> StorageError:
        from botocore.exceptions import ClientError, NoCredentialsError

        url = self.url_for(key)
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            if code == "NoSuchBucket":
                return StorageError(f"S3 bucket does not exist: s3://{self.bucket} (accessing {url})")
            if code in ("NoSuchKey", "404", "NotFound"):
                return ObjectNotFound(f"no such object: {url}")
            if code in ("AccessDenied", "403", "Forbidden"):
                return StorageError(f"access denied to {url}: check AWS credentials and policy")
            return StorageError(f"S3 error on {url}: {code} {err.get('Message', '')}".rstrip())
        if isinstance(exc, NoCredentialsError):
            return StorageError(
                f"no AWS credentials found for {url}: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE"
            )
        return StorageError(f"S3 request for {url} failed: {exc}")

    @contextmanager
    def _errors(self, key: str) -> Iterator[None]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except (ClientError, BotoCoreError) as e:
            raise self._translate(e, key) from e

    def _missing(self, key: str) -> ObjectNotFound:
        """HEAD answers a bare 404 for a missing bucket too; ask the bucket to tell them apart."""
        with self._errors(""):
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except Exception as e:
                code = str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))
                if code in ("404", "NoSuchBucket", "NotFound"):
                    raise StorageError(
                        f"S3 bucket does not exist: s3://{self.bucket} (accessing {self.url_for(key)})"
                    ) from e
                raise
        return ObjectNotFound(f"no such object: {self.url_for(key)}")

    def _get(self, key: str, **kw: Any) -> bytes:
        from botocore.exceptions import IncompleteReadError, ResponseStreamingError

        full = self._key(key)
        attempts = 3
        deadline = time.monotonic() + self._client.limits.deadline_s
        with self._errors(key):
            while True:
                body = self.client.get_object(Bucket=self.bucket, Key=full, **kw)["Body"]
                try:
                    return body.read()
                except (IncompleteReadError, ResponseStreamingError):
                    # botocore retries requests, not a body cut off mid-stream.
                    attempts -= 1
                    if not attempts or time.monotonic() > deadline:
                        raise

    def read(self, key: str) -> bytes:
        return self._get(key)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        self._check_range(start, length)
        if length == 0:
            self.size(key)  # still report a missing object
            return b""
        try:
            return self._get(key, Range=f"bytes={start}-{start + length - 1}")
        except StorageError as e:
            code = getattr(e.__cause__, "response", {}).get("Error", {}).get("Code")
            if code == "InvalidRange":  # start at or past the end
                return b""
            raise

    def write(self, key: str, data: bytes) -> None:
        full = self._key(key)
        with self._errors(key):
            self.client.put_object(Bucket=self.bucket, Key=full, Body=data)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        _check_prefix(prefix)
        root = f"{self.prefix}/" if self.prefix else ""
        out: list[ObjectInfo] = []
        with self._errors(prefix):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=root + prefix)
            for page in pages:
                for obj in page.get("Contents", ()):
                    if not obj["Key"].endswith("/"):  # folder markers made by consoles
                        out.append(ObjectInfo(obj["Key"][len(root) :], obj["Size"]))
        # S3 lists in UTF-8 byte order, but not every S3-compatible server does.
        out.sort(key=lambda o: o.key)
        return out

    def _head(self, key: str) -> dict[str, Any] | None:
        from botocore.exceptions import ClientError

        full = self._key(key)
        with self._errors(key):
            try:
                return self.client.head_object(Bucket=self.bucket, Key=full)
            except ClientError as e:
                if str(e.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
                    return None
                raise

    def exists(self, key: str) -> bool:
        if self._head(key) is not None:
            return True
        self._missing(key)  # raises if the bucket is what's missing
        return False

    def size(self, key: str) -> int:
        head = self._head(key)
        if head is None:
            raise self._missing(key)
        return int(head["ContentLength"])

    def delete(self, key: str) -> None:
        full = self._key(key)
        with self._errors(key):
            self.client.delete_object(Bucket=self.bucket, Key=full)

    def delete_many(self, keys: list[str]) -> int:
        root = f"{self.prefix}/" if self.prefix else ""
        for key in keys:
            _check_key(key)
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            batch = keys[i : i + 1000]
            with self._errors(batch[0]):
                resp = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": root + k} for k in batch], "Quiet": True}
                )
            if resp.get("Errors"):
                err = resp["Errors"][0]
                key = err.get("Key", "")[len(root) :]
                raise StorageError(
                    f"cannot delete {self.url_for(key)}: {err.get('Code')} "
                    f"{err.get('Message', '')} ({len(resp['Errors'])} failed)"
                )
        return len(keys)

    def sub(self, prefix: str) -> S3Storage:
        prefix = prefix.strip("/")
        if not prefix:
            return self
        return S3Storage(self.bucket, self._key(prefix), client=self._client)


# --------------------------------------------------------------------------- factory


def overlapping(a: Storage, b: Storage) -> bool:
    """True when the two roots are the same or one lies inside the other: a job that reads
    one and writes (or clears) the other would then touch its own input."""
    la, lb = a.location(), b.location()
    n = min(len(la), len(lb))
    return la[:n] == lb[:n]


def open_storage(url: str, *, threads: int = 16) -> Storage:
    """Open a store for ``/path``, ``relative/path``, ``file:///path`` or ``s3://bucket/prefix``.

    ``threads`` is how many threads will share the store; it sizes the S3 connection pool.
    """
    if not isinstance(url, str) or not url:
        raise StorageError(f"invalid storage URL {url!r}")
    match = _SCHEME.match(url)
    scheme = match.group(1).lower() if match else ""
    if not scheme:
        return LocalStorage(url)
    parsed = urlparse(url)
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise StorageError(f"file URL with a remote host is not supported: {url}")
        return LocalStorage(unquote(parsed.path) or "/")
    if scheme == "s3":
        if not parsed.netloc:
            raise StorageError(f"S3 URL has no bucket: {url}")
        if parsed.query or parsed.fragment:
            raise StorageError(f"S3 URL may not have a query or fragment: {url}")
        prefix = parsed.path.strip("/")
        try:
            if prefix:
                _check_key(prefix)
        except ValueError as e:
            raise StorageError(f"invalid S3 URL {url}: {e}") from None
        return S3Storage(parsed.netloc, prefix, threads=threads)
    raise StorageError(
        f"unsupported storage URL scheme {scheme!r} in {url} (use a local path, file:///path or s3://bucket/prefix)"
    )
