"""Object storage shared by every keyfill component: local paths and S3, chosen by URL.

Keys are '/'-separated and relative to a store's root URL. Both backends give the same
contract (`base.Storage`: atomic writes, sorted recursive listings, `ObjectNotFound` for
missing keys), so archive code is written once and tested on both. Every error names the
full URL at fault, because a backfill touches thousands of objects and "file not found"
alone is useless. See docs/storage.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import ParseResult, unquote, urlparse

from keygroups.errors import InvalidKey, ObjectExists, ObjectNotFound, StorageError
from keygroups.storage.base import ObjectInfo, Storage, check_key
from keygroups.storage.local import LocalStorage
from keygroups.storage.s3 import S3Storage
from keygroups.storage.s3_client import S3Limits

__all__ = [
    "StorageError",
    "ObjectExists",
    "ObjectNotFound",
    "ObjectInfo",
    "Storage",
    "LocalStorage",
    "S3Storage",
    "S3Limits",
    "open_storage",
    "overlapping",
]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def _open_file(url: str, parsed: ParseResult, threads: int) -> Storage:
    if parsed.netloc not in ("", "localhost"):
        raise StorageError(f"file URL with a remote host is not supported: {url}")
    return LocalStorage(unquote(parsed.path) or "/")


def _open_s3(url: str, parsed: ParseResult, threads: int) -> Storage:
    if not parsed.netloc:
        raise StorageError(f"S3 URL has no bucket: {url}")
    if parsed.query or parsed.fragment:
        raise StorageError(f"S3 URL may not have a query or fragment: {url}")
    prefix = parsed.path.strip("/")
    try:
        if prefix:
            check_key(prefix)
    except InvalidKey as e:
        raise StorageError(f"invalid S3 URL {url}: {e}") from None
    return S3Storage(parsed.netloc, prefix, threads=threads)


# Scheme -> store. s3a:// and s3n:// are the spellings Spark and Hadoop configs use for the
# same buckets; users paste them, and they mean S3 here.
SCHEMES: dict[str, Callable[[str, ParseResult, int], Storage]] = {
    "file": _open_file,
    "s3": _open_s3,
    "s3a": _open_s3,
    "s3n": _open_s3,
}


def open_storage(url: str, *, threads: int = 16) -> Storage:
    """Open a store for ``/path``, ``relative/path``, ``file:///path`` or ``s3://bucket/prefix``
    (``s3a://`` and ``s3n://`` too).

    ``threads`` is how many threads will share the store; it sizes the S3 connection pool.
    """
    if not isinstance(url, str) or not url:
        raise StorageError(f"invalid storage URL {url!r}")
    match = _SCHEME.match(url)
    if not match:
        if url[:6].lower() == "file:/":  # file:/path, as Spark and Hadoop print local paths
            return LocalStorage(unquote(url[5:]))
        return LocalStorage(url)
    opener = SCHEMES.get(match.group(1).lower())
    if opener is None:
        raise StorageError(
            f"unsupported storage URL scheme {match.group(1)!r} in {url} "
            "(use a local path, file:///path or s3://bucket/prefix)"
        )
    return opener(url, urlparse(url), threads)


def overlapping(a: Storage, b: Storage) -> bool:
    """True when the two roots are the same or one lies inside the other: a job that reads
    one and writes (or clears) the other would then touch its own input."""
    la, lb = a.location(), b.location()
    n = min(len(la), len(lb))
    return la[:n] == lb[:n]
