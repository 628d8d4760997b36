"""Azure Blob Storage (and ADLS Gen2 accounts, through their Blob endpoint) with
azure-storage-blob, every wait bounded.

Why the vendor's SDK: keyfill needs create-only uploads (`If-None-Match: *`), block lists
(stage blocks, copy a range of another blob into a block on the server, commit them at once:
how an append continues a segment atomically) and the credential types Azure users have
(connection string, account key, SAS, Entra ID through azure-identity). See docs/storage.md.
"""

from __future__ import annotations

import base64
import builtins
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from keygroups.errors import ObjectNotFound, StorageError
from keygroups.storage.azure_client import (
    STORAGE_SCOPE,
    UPLOAD_PART_BYTES,
    AzureClient,
    credential_origin,
)
from keygroups.storage.base import ObjectInfo, ObjectStore, check_prefix
from keygroups.storage.limits import DeadlineExceeded

log = logging.getLogger(__name__)

# Put Block From URL copies at most 4000 MiB per block; a blob holds at most 50,000 blocks. In
# keyfill's words an Azure block is an upload part (a "block" is an Avro block of a segment file).
MAX_COPY_PART_BYTES = 1 << 30


def error_code(exc: BaseException | None) -> str:
    """The service's error code (BlobNotFound, ...) of an SDK error, as a plain string."""
    code = getattr(exc, "error_code", None) or ""
    return str(getattr(code, "value", code))


class AzureStorage(ObjectStore):
    """Blobs under one container and prefix of an account. Block blob uploads are atomic
    (a blob appears whole at Put Blob or Put Block List), so writes need no temp blobs.

    ``root`` is the URL as the user spelled its scheme and account (az://, abfss://,
    wasbs://), so messages name what they pasted."""

    list_page: int | None = None  # blobs per listing page; None: the service's (5,000)

    def __init__(self, root: str, container: str, prefix: str, client: AzureClient) -> None:
        self.root = root.rstrip("/")
        self.container = container
        self.prefix = prefix.strip("/")
        self.url = f"{self.root}/{self.prefix}" if self.prefix else self.root
        self._client = client

    def location(self) -> tuple[str, ...]:
        return ("azure", self._client.account, self.container, *[p for p in self.prefix.split("/") if p])

    def _blob(self, name: str) -> Any:
        return self.client.get_blob_client(self.container, name)

    def _container(self) -> Any:
        return self.client.get_container_client(self.container)

    @contextmanager
    def _errors(self, key: str) -> Iterator[None]:
        try:
            yield
        except DeadlineExceeded as e:  # the retry hook's: name the object, as every store does
            raise self._translate(e, key) from e
        except StorageError as e:
            if self.root not in str(e):  # raised while the client was built: name the object
                raise type(e)(f"{self.url_for(key)}: {e}") from e.__cause__
            raise
        except Exception as e:
            raise self._translate(e, key) from e

    def _translate(self, exc: Exception, key: str) -> StorageError:
        from azure.core import exceptions as aex

        url = self.url_for(key)
        code = error_code(exc)
        if code == "ContainerNotFound":
            return StorageError(f"Azure container does not exist: {self.root} (accessing {url})")
        if isinstance(exc, aex.ResourceNotFoundError) or code == "BlobNotFound":
            return ObjectNotFound(url)
        if (
            isinstance(exc, aex.ClientAuthenticationError)
            or code.startswith("Authorization")
            or getattr(exc, "status_code", None) == 403
        ):
            detail = code or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return StorageError(
                f"access denied to {url} ({detail}): check the credential, {credential_origin()}, and its role"
            )
        if isinstance(exc, DeadlineExceeded):
            return DeadlineExceeded(f"Azure request for {url} failed: {exc}")
        if isinstance(exc, aex.HttpResponseError) and getattr(exc, "status_code", None) is not None:
            return StorageError(f"Azure error on {url}: {exc.status_code} {code or exc.reason}".rstrip())
        if isinstance(exc, aex.AzureError):  # no answer from the service (a body cut short or stalled: no status)
            first = (str(exc.message or exc).strip().splitlines() or [type(exc).__name__])[0]
            return StorageError(f"Azure request for {url} failed: {first}")
        if type(exc).__name__ == "CredentialUnavailableError":
            return StorageError(f"no Azure credentials found for {url}: {exc}")
        return StorageError(f"Azure request for {url} failed: {type(exc).__name__}: {exc}")

    def read(self, key: str) -> bytes:
        name = self._name(key)
        with self._errors(key):
            data: bytes = self._blob(name).download_blob(max_concurrency=1).readall()
            return data

    def _get_range(self, key: str, start: int, length: int) -> bytes:
        name = self._name(key)
        with self._errors(key):
            data: bytes = self._blob(name).download_blob(offset=start, length=length, max_concurrency=1).readall()
            return data

    def _past_end(self, cause: BaseException | None) -> bool:
        return error_code(cause) == "InvalidRange"

    def write(self, key: str, data: bytes) -> None:
        name = self._name(key)
        with self._errors(key):
            self._blob(name).upload_blob(bytes(data), overwrite=True, max_concurrency=2)

    def write_after(self, key: str, base: str, data: bytes) -> None:
        """Stage `base` into blocks of `key` on the server (Put Block From URL, in ranges of at
        most 1 GiB), stage `data` after them, commit the list: `key` appears whole at once.
        Where the endpoint has no Put Block From URL (Azurite answers APINotImplemented),
        `base` passes through this process instead, logged once per store client."""
        size = self.size(base)  # ObjectNotFound names base
        if size and self._client.copy_from_url:
            try:
                self._stage_and_commit(key, base, size, data)
                return
            except StorageError as e:
                code = error_code(e.__cause__)
                # Azurite has no Put Block From URL; an account behind a firewall may refuse
                # the service reading its own blob (CannotVerifyCopySource)
                if code not in ("APINotImplemented", "NotImplemented", "CannotVerifyCopySource"):
                    raise
                self._client.copy_from_url = False
                log.info(
                    "%s: Put Block From URL refused (%s): appends copy segment files through this process",
                    self.root,
                    code,
                )
        self.write(key, self.read(base) + bytes(data))

    def _stage_and_commit(self, key: str, base: str, size: int, data: bytes) -> None:
        from azure.storage.blob import BlobBlock

        target, source = self._blob(self._name(key)), self._blob(self._name(base))
        base_url, auth = self._readable(source)
        upload = uuid.uuid4().hex[:16]
        parts: list[Any] = []

        def part_id() -> str:
            return base64.b64encode(f"{upload}-{len(parts):08d}".encode()).decode()

        with self._errors(key):
            for at in range(0, size, MAX_COPY_PART_BYTES):
                bid = part_id()
                length = min(MAX_COPY_PART_BYTES, size - at)
                target.stage_block_from_url(bid, base_url, source_offset=at, source_length=length, **auth)
                parts.append(BlobBlock(bid))
            view = memoryview(data)
            for at in range(0, len(data), UPLOAD_PART_BYTES):
                bid = part_id()
                target.stage_block(bid, bytes(view[at : at + UPLOAD_PART_BYTES]))
                parts.append(BlobBlock(bid))
            # uncommitted blocks of a blob never committed are dropped by the service within a week
            target.commit_block_list(parts)

    def _readable(self, source: Any) -> tuple[str, dict[str, Any]]:
        """The source blob's URL as the service may read it for Put Block From URL: with a SAS
        of its own under an account key, the caller's SAS, or the caller's bearer token."""
        credential = self.client.credential
        key = getattr(credential, "account_key", None)
        if key:
            from datetime import datetime, timedelta, timezone

            from azure.storage.blob import BlobSasPermissions, generate_blob_sas

            sas = generate_blob_sas(
                credential.account_name,
                source.container_name,
                source.blob_name,
                account_key=key,
                permission=BlobSasPermissions(read=True),
                expiry=datetime.now(timezone.utc) + timedelta(hours=1),
            )
            return f"{source.url}?{sas}", {}
        if hasattr(credential, "get_token"):
            token = credential.get_token(STORAGE_SCOPE).token
            return source.url, {"source_authorization": f"Bearer {token}"}
        signature = getattr(credential, "signature", None)  # AzureSasCredential
        if signature:
            return f"{source.url}?{signature}", {}
        return source.url, {}  # a SAS in the connection string is part of source.url already

    def create(self, key: str, data: bytes) -> None:
        name = self._name(key)
        try:
            with self._errors(key):
                # overwrite=False sends If-None-Match: *; 409 BlobAlreadyExists otherwise
                self._blob(name).upload_blob(bytes(data), overwrite=False)
        except StorageError as e:
            from azure.core.exceptions import ResourceExistsError

            if not (isinstance(e.__cause__, ResourceExistsError) or error_code(e.__cause__) == "BlobAlreadyExists"):
                raise
            self._create_refused(key, data)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(prefix)
        root = f"{self.prefix}/" if self.prefix else ""
        out: list[ObjectInfo] = []
        with self._errors(prefix):
            for blob in self._container().list_blobs(name_starts_with=root + prefix, results_per_page=self.list_page):
                key = blob.name[len(root) :]
                # ADLS Gen2 lists its folders as empty blobs marked hdi_isfolder
                if key.endswith("/") or (blob.metadata or {}).get("hdi_isfolder") == "true":
                    continue
                modified = int(blob.last_modified.timestamp() * 1000) if blob.last_modified else 0
                out.append(ObjectInfo(key, int(blob.size or 0), modified))
        out.sort(key=lambda o: o.key)
        return out

    def _stat(self, key: str) -> int | None:
        try:
            with self._errors(key):
                return int(self._blob(self._name(key)).get_blob_properties().size)
        except ObjectNotFound:
            return None

    def _missing(self, key: str) -> StorageError:
        """HEAD of a blob answers a bare 404 when the container is missing too."""
        with self._errors(key):
            found = self._container().exists()
        if not found:
            return StorageError(f"Azure container does not exist: {self.root} (accessing {self.url_for(key)})")
        return ObjectNotFound(self.url_for(key))

    def delete(self, key: str) -> None:
        name = self._name(key)
        try:
            with self._errors(key):
                self._blob(name).delete_blob()
        except ObjectNotFound:
            pass  # a missing blob; a missing container raised StorageError above

    def delete_many(self, keys: builtins.list[str]) -> int:
        names = [self._name(k) for k in keys]
        for i in range(0, len(names), 256):  # a blob batch holds at most 256 requests
            batch = names[i : i + 256]
            with self._errors(keys[i]):
                results = self._container().delete_blobs(*batch, raise_on_any_failure=False)
            for name, result in zip(batch, results):
                if result.status_code >= 300 and result.status_code != 404:
                    key = name[len(self.prefix) + 1 :] if self.prefix else name
                    failed = sum(1 for r in results if r.status_code >= 300 and r.status_code != 404)
                    raise StorageError(
                        f"cannot delete {self.url_for(key)}: HTTP {result.status_code} ({failed} failed)"
                    )
        return len(keys)

    def sub(self, prefix: str) -> AzureStorage:
        prefix = prefix.strip("/")
        if not prefix:
            return self
        name = self._name(prefix)
        return AzureStorage(self.root, self.container, name, self._client)
