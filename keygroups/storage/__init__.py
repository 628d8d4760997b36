"""Object storage shared by every keyfill component: local paths, S3, GCS and Azure Blob
Storage, chosen by URL.

Keys are '/'-separated and relative to a store's root URL. Every backend gives the same
contract (`base.Storage`: atomic writes, create-only writes, sorted recursive listings,
`ObjectNotFound` for missing keys), so archive code is written once and tested on all. Every error names the
full URL at fault, because a backfill touches thousands of objects and "file not found"
alone is useless. See docs/storage.md.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import ParseResult, unquote, urlparse

from keygroups.errors import InvalidKey, ObjectExists, ObjectNotFound, StorageError
from keygroups.storage.base import ObjectInfo, Storage, check_key
from keygroups.storage.limits import StoreLimits
from keygroups.storage.local import LocalStorage

if TYPE_CHECKING:
    from keygroups.storage.azure import AzureStorage
    from keygroups.storage.gcs import GcsStorage
    from keygroups.storage.s3 import S3Storage
    from keygroups.storage.s3_client import S3Limits

# The remote stores' modules are imported when a URL of theirs is opened (or a name of theirs
# asked for): every query over the Spark source starts a Python process that imports this
# package, and the three cost it ~20 ms it spends for nothing on the other stores' URLs.
_LAZY = {
    "AzureStorage": "keygroups.storage.azure",
    "GcsStorage": "keygroups.storage.gcs",
    "S3Storage": "keygroups.storage.s3",
    "S3Limits": "keygroups.storage.s3_client",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "StorageError",
    "ObjectExists",
    "ObjectNotFound",
    "ObjectInfo",
    "Storage",
    "LocalStorage",
    "S3Storage",
    "GcsStorage",
    "AzureStorage",
    "S3Limits",
    "StoreLimits",
    "open_storage",
    "overlapping",
]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def _open_file(url: str, parsed: ParseResult, threads: int) -> Storage:
    if parsed.netloc not in ("", "localhost"):
        raise StorageError(f"file URL with a remote host is not supported: {url}")
    return LocalStorage(unquote(parsed.path) or "/")


def _bucket_and_prefix(url: str, parsed: ParseResult, store: str, bucket: str = "bucket") -> tuple[str, str]:
    """The URL's host (a bucket or container) and its path as a checked key prefix."""
    if not parsed.netloc:
        raise StorageError(f"{store} URL has no {bucket}: {url}")
    if parsed.query or parsed.fragment:
        raise StorageError(
            f"{store} URL may not have a query or fragment: {url} (credentials come from the environment)"
        )
    prefix = parsed.path.strip("/")
    try:
        if prefix:
            check_key(prefix)
    except InvalidKey as e:
        raise StorageError(f"invalid {store} URL {url}: {e}") from None
    return parsed.netloc, prefix


def _open_s3(url: str, parsed: ParseResult, threads: int) -> Storage:
    from keygroups.storage.s3 import S3Storage

    return S3Storage(*_bucket_and_prefix(url, parsed, "S3"), threads=threads)


def _open_gcs(url: str, parsed: ParseResult, threads: int) -> Storage:
    from keygroups.storage.gcs import GcsStorage

    return GcsStorage(*_bucket_and_prefix(url, parsed, "GCS"), threads=threads)


# The hosts of Azure URLs as Spark and Hadoop print them: the account, the service (dfs for
# abfs, blob for wasb), then the cloud's suffix (core.windows.net, core.chinacloudapi.cn, ...).
_AZURE_HOST = re.compile(r"^([a-z0-9]{3,24})\.(?:dfs|blob)\.(.+)$")


def _open_azure(url: str, parsed: ParseResult, threads: int) -> Storage:
    from keygroups.storage.azure import AzureStorage
    from keygroups.storage.azure_client import AzureClient, connection_string_account

    netloc, prefix = _bucket_and_prefix(url, parsed, "Azure", "container")
    container, at, host = netloc.partition("@")
    conn_account = connection_string_account()
    if at:
        match = _AZURE_HOST.match(host.lower())
        if not match:
            raise StorageError(
                f"Azure URL {url}: expected container@ACCOUNT.dfs.core.windows.net "
                "or container@ACCOUNT.blob.core.windows.net"
            )
        account, suffix = match.groups()
        if conn_account and conn_account != account:
            raise StorageError(
                f"Azure URL {url} names account {account!r}, "
                f"but AZURE_STORAGE_CONNECTION_STRING is for {conn_account!r}"
            )
    else:
        account, suffix = conn_account or os.environ.get("AZURE_STORAGE_ACCOUNT", ""), "core.windows.net"
        if not account:
            raise StorageError(
                f"Azure URL {url} names no account: write "
                f"{parsed.scheme}://{container}@ACCOUNT.dfs.core.windows.net/..., "
                "or set AZURE_STORAGE_ACCOUNT (or AZURE_STORAGE_CONNECTION_STRING)"
            )
    if not container:
        raise StorageError(f"Azure URL has no container: {url}")
    root = f"{parsed.scheme.lower()}://{netloc}"
    return AzureStorage(root, container, prefix, AzureClient(threads, account, suffix))


# Scheme -> store. s3a:// and s3n:// are the spellings Spark and Hadoop configs use for the
# same buckets, abfs[s]:// and wasb[s]:// Azure's (ADLS Gen2 and Blob), gcs:// fsspec's for
# GCS; users paste them, and they mean the same stores here.
SCHEMES: dict[str, Callable[[str, ParseResult, int], Storage]] = {
    "file": _open_file,
    "s3": _open_s3,
    "s3a": _open_s3,
    "s3n": _open_s3,
    "gs": _open_gcs,
    "gcs": _open_gcs,
    "az": _open_azure,
    "abfs": _open_azure,
    "abfss": _open_azure,
    "wasb": _open_azure,
    "wasbs": _open_azure,
}


def open_storage(url: str, *, threads: int = 16) -> Storage:
    """Open a store for ``/path``, ``relative/path``, ``file:///path``, ``s3://bucket/prefix``
    (``s3a://``, ``s3n://``), ``gs://bucket/prefix`` or ``az://container/prefix``
    (``abfss://container@account.dfs.core.windows.net/prefix``, ``wasbs://…``).

    ``threads`` is how many threads will share the store; it sizes the connection pool.
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
            "(use a local path, file:///path, s3://bucket/prefix, gs://bucket/prefix or az://container/prefix)"
        )
    return opener(url, urlparse(url), threads)


def overlapping(a: Storage, b: Storage) -> bool:
    """True when the two roots are the same or one lies inside the other: a job that reads
    one and writes (or clears) the other would then touch its own input."""
    la, lb = a.location(), b.location()
    n = min(len(la), len(lb))
    return la[:n] == lb[:n]
