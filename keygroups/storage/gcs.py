"""Google Cloud Storage through google-cloud-storage, with every wait bounded.

Why the vendor's SDK and not one library over every cloud (obstore, gcsfs): keyfill needs
`compose` (server-side concatenation, how an append continues a segment) and generation
preconditions (`ifGenerationMatch=0`, how commits are create-only), and the SDK gives both
directly along with Application Default Credentials. See docs/storage.md.
"""

from __future__ import annotations

import builtins
import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from keygroups.errors import ObjectNotFound, StorageError
from keygroups.storage.base import TMP_PREFIX, ObjectInfo, ObjectStore, check_key, check_prefix
from keygroups.storage.clients import LazyClient
from keygroups.storage.limits import DeadlineExceeded

_NEEDS = "gs:// URLs need google-cloud-storage: pip install 'keyfill[gcs]'"
_TRACES = "ENABLE_GCS_PYTHON_CLIENT_OTEL_TRACES"  # the SDK's switch for its OpenTelemetry spans


def _sdk_traces_on() -> bool:
    """Whether the SDK makes OpenTelemetry spans, read from its variable as it reads it."""
    return os.environ.get(_TRACES, "").strip().lower() in {"1", "true", "yes", "on"}


class GcsClient(LazyClient):
    """A google-cloud-storage client: credentials by Application Default Credentials
    (GOOGLE_APPLICATION_CREDENTIALS, gcloud's ADC file, the metadata server of GCE, GKE
    workload identity, Dataproc), project from GOOGLE_CLOUD_PROJECT where one is needed,
    and STORAGE_EMULATOR_HOST for an emulator."""

    ENV_PREFIXES = ("GOOGLE_", "GCLOUD_", "CLOUDSDK_", "STORAGE_EMULATOR_HOST", "GCE_METADATA", _TRACES)

    def _make(self) -> Any:
        try:
            import requests.adapters
            from google.cloud import storage
        except ImportError as e:
            raise StorageError(f"{_NEEDS} ({e})") from None
        # Object calls need no project; passing None keeps the SDK from insisting on one.
        client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT") or None)
        # The SDK's requests session keeps 10 connections; read-ahead keeps more in flight.
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=self.pool_size(), max_retries=0)
        client._http.mount("https://", adapter)
        client._http.mount("http://", adapter)
        if not _sdk_traces_on():
            # google-cloud-storage 3.17 starts a thread on a client's first call to a bucket
            # that GETs the bucket's metadata, only to label OpenTelemetry spans. With traces
            # off it labels nothing, and it costs a request per process and bucket, asks for
            # a permission (storage.buckets.get) an object reader may lack, and shares the
            # client's connections with keyfill's reads: its 401s took part in a read's
            # credential refreshes. None is how the SDK itself tells the cache is absent.
            client._bucket_metadata_cache = None
        return client

    _options: dict[str, Any] | None = None

    def call_options(self) -> dict[str, Any]:
        """Per-request bounds: (connect, read) timeouts, and retries (429, 5xx, dropped
        connections, with backoff) that start no later than the deadline allows."""
        if self._options is not None:
            return self._options
        from google.cloud.storage.retry import DEFAULT_RETRY

        budget = self.limits.deadline_s - self.limits.read_s
        # with_timeout since google-api-core 2.17; with_deadline before it
        retry = getattr(DEFAULT_RETRY, "with_timeout", None) or DEFAULT_RETRY.with_deadline
        retry = retry(budget)
        self._options = {"timeout": (self.limits.connect_s, self.limits.read_s), "retry": retry}
        return self._options


class GcsStorage(ObjectStore):
    """Objects under ``gs://bucket/prefix``. Uploads are atomic on GCS (an object appears
    whole when its upload finishes), so writes need no temp objects; an append's
    continuation does (see `write_after`)."""

    list_page: int | None = None  # objects per listing page; None: the service's (1,000)

    def __init__(self, bucket: str, prefix: str = "", *, threads: int = 16, client: GcsClient | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"gs://{bucket}/{self.prefix}" if self.prefix else f"gs://{bucket}"
        self._client = client or GcsClient(threads)

    def location(self) -> tuple[str, ...]:
        return ("gs", self.bucket, *[p for p in self.prefix.split("/") if p])

    def _blob(self, name: str) -> Any:
        return self.client.bucket(self.bucket).blob(name)

    @contextmanager
    def _errors(self, key: str) -> Iterator[Any]:
        """Yields the per-call options; turns the SDK's errors into ours, naming the URL."""
        try:
            yield self._client.call_options()
        except StorageError:
            raise
        except Exception as e:
            raise self._translate(e, key) from e

    def _translate(self, exc: Exception, key: str) -> StorageError:
        from google.api_core import exceptions as gex
        from google.auth.exceptions import DefaultCredentialsError, InvalidOperation, RefreshError

        url = self.url_for(key)
        sdk = self._client._client  # None when building it failed: no credentials to name
        origin = credential_origin(getattr(sdk, "_credentials", None)) if sdk is not None else ""
        if isinstance(exc, InvalidOperation) and origin.startswith("anonymous"):
            # google-auth answers a 401 by refreshing the credentials, which anonymous ones cannot
            return StorageError(f"GCS refused the credentials for {url} (401 Unauthorized): they came from {origin}")
        if isinstance(exc, DefaultCredentialsError):
            return StorageError(
                f"no Google credentials found for {url}: run `gcloud auth application-default login`, "
                "set GOOGLE_APPLICATION_CREDENTIALS, or run with a service account (workload identity)"
            )
        if isinstance(exc, RefreshError):
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return StorageError(f"GCS credentials for {url} could not be refreshed ({first}): they came from {origin}")
        if isinstance(exc, gex.NotFound):
            return ObjectNotFound(url)
        if isinstance(exc, gex.Unauthorized):  # still refused after google-auth refreshed them
            return StorageError(
                f"GCS refused the credentials for {url} (401 {_error_message(exc)}): they came from {origin}"
            )
        if isinstance(exc, gex.Forbidden):
            return StorageError(f"access denied to {url} (403): check the credentials, from {origin}, and the IAM role")
        if isinstance(exc, gex.RetryError):  # the client's own deadline over its retries: keyfill's, set from ours
            return DeadlineExceeded(
                f"GCS request for {url} failed: gave up after retrying until the deadline: {_last_answer(exc)}"
            )
        if isinstance(exc, gex.GoogleAPICallError):
            return StorageError(f"GCS error on {url}: {exc.code} {exc.message}".rstrip())
        return StorageError(f"GCS request for {url} failed: {type(exc).__name__}: {exc}")

    def _missing(self, key: str) -> StorageError:
        """A 404 is the same for a missing object and a missing bucket: ask the bucket. A
        read-only role may not see bucket metadata (403): then the object is what's missing."""
        from google.api_core import exceptions as gex

        try:
            with self._errors("") as opts:
                found = self.client.bucket(self.bucket).exists(**opts)
        except StorageError as e:
            if isinstance(e.__cause__, gex.Forbidden):
                found = True
            else:
                raise
        if not found:
            return StorageError(f"GCS bucket does not exist: gs://{self.bucket} (accessing {self.url_for(key)})")
        return ObjectNotFound(self.url_for(key))

    @contextmanager
    def _object(self, key: str) -> Iterator[Any]:
        """`_errors`, where a 404 asks whether the bucket or the object is missing."""
        try:
            with self._errors(key) as opts:
                yield opts
        except ObjectNotFound:
            raise self._missing(key) from None

    def read(self, key: str) -> bytes:
        name = self._name(key)
        with self._object(key) as opts:
            data: bytes = self._blob(name).download_as_bytes(raw_download=True, **opts)
            return data

    def _get_range(self, key: str, start: int, length: int) -> bytes:
        name = self._name(key)
        with self._object(key) as opts:
            data: bytes = self._blob(name).download_as_bytes(
                start=start, end=start + length - 1, raw_download=True, checksum=None, **opts
            )
            return data

    def _past_end(self, cause: BaseException | None) -> bool:
        from google.api_core import exceptions as gex

        return isinstance(cause, gex.RequestRangeNotSatisfiable)

    def write(self, key: str, data: bytes) -> None:
        name = self._name(key)
        with self._object(key) as opts:
            self._blob(name).upload_from_string(bytes(data), content_type="application/octet-stream", **opts)

    def write_after(self, key: str, base: str, data: bytes) -> None:
        """Upload `data` as a hidden temp object beside `key`, then compose base + temp into
        `key` on the server (one atomic call; base never passes through this process), then
        delete the temp object."""
        name, base_name = self._name(key), self._name(base)
        self.size(base)  # ObjectNotFound names base
        folder = name.rpartition("/")[0]
        tmp = f"{folder}/{TMP_PREFIX}{uuid.uuid4().hex}" if folder else f"{TMP_PREFIX}{uuid.uuid4().hex}"
        bucket = self.client.bucket(self.bucket)
        try:
            with self._object(key) as opts:
                parts = [bucket.blob(base_name)]
                if data:
                    bucket.blob(tmp).upload_from_string(bytes(data), **opts)
                    parts.append(bucket.blob(tmp))
                target = bucket.blob(name)
                target.content_type = "application/octet-stream"
                target.compose(parts, **opts)
        finally:
            if data:
                try:
                    # one attempt: the SDK's default retry would go on for two minutes after a
                    # failed compose, delaying its error past every deadline (found through an
                    # outage of 503s: an append failed after 92 s instead of 2 s)
                    limits = self._client.limits
                    bucket.blob(tmp).delete(timeout=(limits.connect_s, limits.read_s), retry=None)
                except Exception:
                    pass  # listings hide temp objects, as they hide a killed local writer's temp files

    def create(self, key: str, data: bytes) -> None:
        from google.api_core import exceptions as gex

        name = self._name(key)
        try:
            with self._object(key) as opts:
                # ifGenerationMatch=0: only if no live object has the name (412 otherwise).
                self._blob(name).upload_from_string(
                    bytes(data), content_type="application/octet-stream", if_generation_match=0, **opts
                )
        except StorageError as e:
            if not isinstance(e.__cause__, gex.PreconditionFailed):
                raise
            self._create_refused(key, data)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(prefix)
        root = f"{self.prefix}/" if self.prefix else ""
        out: list[ObjectInfo] = []
        with self._object(prefix) as opts:
            for blob in self.client.list_blobs(self.bucket, prefix=root + prefix, page_size=self.list_page, **opts):
                key = blob.name[len(root) :]
                # folder markers made by consoles, and temp objects of writes in flight
                if key.endswith("/") or f"/{TMP_PREFIX}" in f"/{key}":
                    continue
                modified = int(blob.updated.timestamp() * 1000) if blob.updated else 0
                out.append(ObjectInfo(key, int(blob.size or 0), modified))
        out.sort(key=lambda o: o.key)
        return out

    def _stat(self, key: str) -> int | None:
        with self._errors(key) as opts:
            blob = self.client.bucket(self.bucket).get_blob(self._name(key), **opts)
        return None if blob is None else int(blob.size)

    def delete(self, key: str) -> None:
        name = self._name(key)
        try:
            with self._errors(key) as opts:
                self._blob(name).delete(**opts)
        except ObjectNotFound:
            missing = self._missing(key)
            if not isinstance(missing, ObjectNotFound):
                raise missing from None

    def delete_many(self, keys: builtins.list[str]) -> int:
        for key in keys:
            check_key(key)
        if not keys:
            return 0
        # GCS deletes one object per request; the JSON batch endpoint is not on every
        # emulator, so the requests go out side by side instead.
        with ThreadPoolExecutor(max(1, min(16, self._client.threads, len(keys)))) as pool:
            list(pool.map(self.delete, keys))
        return len(keys)

    def sub(self, prefix: str) -> GcsStorage:
        prefix = prefix.strip("/")
        if not prefix:
            return self
        return GcsStorage(self.bucket, self._name(prefix), client=self._client)


def credential_origin(credentials: Any) -> str:
    """Where the client's Google credentials came from, by their type (what Application
    Default Credentials found), for an error that says GCS refused them."""
    kind = type(credentials).__module__ + "." + type(credentials).__name__
    if credentials is None or kind == "google.auth.credentials.AnonymousCredentials":
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        return f"anonymous credentials (STORAGE_EMULATOR_HOST={emulator})" if emulator else "anonymous credentials"
    words = {
        "google.oauth2.service_account.Credentials": "a service-account key",
        "google.oauth2.credentials.Credentials": "a user's login",
        "google.auth.compute_engine.credentials.Credentials": "the metadata server's account (GCE, GKE, Dataproc)",
        "google.auth.impersonated_credentials.Credentials": "an impersonated service account",
    }.get(kind, f"{kind} credentials")
    if kind.startswith(
        ("google.auth.external_account", "google.auth.identity_pool", "google.auth.aws", "google.auth.pluggable")
    ):
        words = "workload identity federation (an external account)"
    email = getattr(credentials, "service_account_email", None)
    if isinstance(email, str) and "@" in email:
        words += f" of {email}"
    if "metadata server" in words:
        return words
    key_file = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    return f"{words} in GOOGLE_APPLICATION_CREDENTIALS={key_file}" if key_file else f"{words} from gcloud's ADC file"


def _error_message(exc: Any) -> str:
    """The message of GCS's JSON error (a download's error prints its URL, the JSON and the
    client's argument tuple), else the exception's own."""
    try:
        return str(exc.response.json()["error"]["message"])
    except Exception:
        return str(exc.message).strip().splitlines()[0] if str(exc.message).strip() else type(exc).__name__


def _last_answer(exc: Any) -> str:
    """What the last attempt got: the HTTP status and reason of a refused download (the
    client's InvalidResponse prints as a tuple of its arguments), else the error itself."""
    cause = exc.cause or exc
    response = getattr(cause, "response", None)
    status = getattr(response, "status_code", None)
    if status is not None:
        return f"{status} {getattr(response, 'reason', '') or ''}".rstrip()
    return str(cause)
