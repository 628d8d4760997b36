"""S3 (and S3-compatible stores) through boto3, with every wait bounded."""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from keygroups.errors import ObjectExists, ObjectNotFound, StorageError
from keygroups.storage.base import ObjectInfo, ObjectStore, check_key, check_prefix
from keygroups.storage.limits import DeadlineExceeded
from keygroups.storage.s3_client import S3Client, credential_origin

# Objects from this size up are uploaded as concurrent multipart parts of this size (boto3's
# managed transfer): no 5 GB single-PUT ceiling, a failed part is retried alone.
MULTIPART_BYTES = 16 << 20
# S3's limits on multipart uploads: every part but the last at least 5 MiB, a copied part at
# most 5 GiB (kept well below here).
MIN_PART_BYTES = 5 << 20
MAX_COPY_PART_BYTES = 1 << 30
# S3's answers to credentials it does not take: a session token that has ended (ExpiredToken,
# as STS's temporary credentials do after their hour), keys it does not know or that sign wrong
REFUSED_CREDENTIALS = (
    "ExpiredToken",
    "ExpiredTokenException",
    "TokenRefreshRequired",
    "InvalidToken",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
)
# Requests of one GET whose body is cut off or stops coming: the first and two more.
BODY_ATTEMPTS = 3


def error_code(exc: BaseException | None) -> str:
    """The service's error code (NoSuchKey, 404, ...) of a botocore error, "" when there is
    none: an error without an answer (a body cut short, a read timeout) carries response=None."""
    return str(((getattr(exc, "response", None) or {}).get("Error") or {}).get("Code") or "")


class S3Storage(ObjectStore):
    """Objects under ``s3://bucket/prefix``. PUT is atomic on S3, so no temp objects."""

    multipart_bytes = MULTIPART_BYTES

    def __init__(self, bucket: str, prefix: str = "", *, threads: int = 16, client: S3Client | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client = client or S3Client(threads)

    def location(self) -> tuple[str, ...]:
        return ("s3", self.bucket, *[p for p in self.prefix.split("/") if p])

    def _translate(self, exc: Exception, key: str) -> StorageError:
        from botocore.exceptions import ClientError, NoCredentialsError

        url = self.url_for(key)
        if isinstance(exc, ClientError):
            code = error_code(exc)
            if code == "NoSuchBucket":
                return StorageError(f"S3 bucket does not exist: s3://{self.bucket} (accessing {url})")
            if code in ("NoSuchKey", "404", "NotFound"):
                return ObjectNotFound(url)
            message = exc.response.get("Error", {}).get("Message", "")
            if code in ("AccessDenied", "403", "Forbidden"):
                return StorageError(
                    f"access denied to {url}: check the credentials, from {credential_origin(self.client)}, "
                    "and the bucket's policy"
                )
            if code in REFUSED_CREDENTIALS:
                return StorageError(
                    f"S3 refused the credentials for {url} ({code}: {message}): they came from "
                    f"{credential_origin(self.client)}"
                )
            return StorageError(f"S3 error on {url}: {code} {message}".rstrip())
        if isinstance(exc, NoCredentialsError):
            return StorageError(
                f"no AWS credentials found for {url}: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE"
            )
        endpoint = self.client.meta.endpoint_url
        where = "" if endpoint in str(exc) else f" (endpoint {endpoint})"  # a body's read timeout names none
        kind = DeadlineExceeded if isinstance(exc, DeadlineExceeded) else StorageError
        return kind(f"S3 request for {url} failed{where}: {exc}")

    @contextmanager
    def _errors(self, key: str) -> Iterator[None]:
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except (ClientError, BotoCoreError) as e:
            raise self._translate(e, key) from e
        except S3UploadFailedError as e:  # a multipart upload: the managed transfer wraps the cause
            cause = e.__cause__ or e.__context__
            if isinstance(cause, (ClientError, BotoCoreError)):
                raise self._translate(cause, key) from e
            raise StorageError(f"upload of {self.url_for(key)} failed: {e}") from e

    def _missing(self, key: str) -> StorageError:
        """HEAD answers a bare 404 for a missing bucket too; ask the bucket to tell them apart."""
        with self._errors(""):
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except Exception as e:
                if error_code(e) in ("404", "NoSuchBucket", "NotFound"):
                    return StorageError(f"S3 bucket does not exist: s3://{self.bucket} (accessing {self.url_for(key)})")
                raise
        return ObjectNotFound(self.url_for(key))

    def _get(self, key: str, **kw: Any) -> bytes:
        from botocore.exceptions import IncompleteReadError, ReadTimeoutError, ResponseStreamingError

        full = self._name(key)
        attempts = BODY_ATTEMPTS
        with self._errors(key):
            while True:
                body = self.client.get_object(Bucket=self.bucket, Key=full, **kw)["Body"]
                try:
                    data: bytes = body.read()
                    return data
                except (IncompleteReadError, ResponseStreamingError, ReadTimeoutError) as e:
                    # botocore retries requests, not a body cut off or stopped mid-stream
                    # (GCS's and Azure's clients fetch such a body again). Each wait is
                    # bounded by the read timeout and each re-request by the deadline, so a
                    # long transfer cut near its end is fetched again, not abandoned.
                    attempts -= 1
                    if attempts:
                        continue
                    if isinstance(e, ReadTimeoutError):  # it names no endpoint ("None"): say what happened
                        raise StorageError(
                            f"S3 request for {self.url_for(key)} failed (endpoint {self.client.meta.endpoint_url}): "
                            f"its body stopped coming, no bytes for {self._client.limits.read_s:g} s "
                            f"(KEYFILL_STORAGE_READ_TIMEOUT), {BODY_ATTEMPTS} times"
                        ) from e
                    raise

    def read(self, key: str) -> bytes:
        return self._get(key)

    def _get_range(self, key: str, start: int, length: int) -> bytes:
        return self._get(key, Range=f"bytes={start}-{start + length - 1}")

    def _past_end(self, cause: BaseException | None) -> bool:
        return error_code(cause) == "InvalidRange"

    def write(self, key: str, data: bytes) -> None:
        full = self._name(key)
        with self._errors(key):
            if len(data) < self.multipart_bytes:
                self.client.put_object(Bucket=self.bucket, Key=full, Body=data)
                return
            import io

            from boto3.s3.transfer import TransferConfig

            config = TransferConfig(
                multipart_threshold=self.multipart_bytes,
                multipart_chunksize=self.multipart_bytes,
                max_concurrency=max(2, min(8, self._client.threads)),
                # not the CRT transfer client (when awscrt is installed): it would bypass
                # this client's configuration, its timeouts and deadline hooks
                preferred_transfer_client="classic",
            )
            # The object appears whole at CompleteMultipartUpload, or not at all (s3transfer
            # aborts the upload on failure): the same atomicity as one PUT.
            self.client.upload_fileobj(io.BytesIO(data), self.bucket, full, Config=config)

    def write_after(self, key: str, base: str, data: bytes) -> None:
        size = self.size(base)  # ObjectNotFound names base
        if size < MIN_PART_BYTES:  # too small to be a part of its own: through this process
            self.write(key, self.read(base) + data)
            return
        full = self._name(key)
        with self._errors(key):
            upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=full)["UploadId"]
            try:
                parts: list[str] = []
                # the server copies base (ranges of at most 5 GiB each, all but the last part
                # at least 5 MiB); data follows in parts of the managed transfer's size
                n = -(-size // MAX_COPY_PART_BYTES)
                cuts = [size * i // n for i in range(n + 1)]
                for a, b in zip(cuts, cuts[1:]):
                    r = self.client.upload_part_copy(
                        Bucket=self.bucket,
                        Key=full,
                        UploadId=upload,
                        PartNumber=len(parts) + 1,
                        CopySource={"Bucket": self.bucket, "Key": self._name(base)},
                        CopySourceRange=f"bytes={a}-{b - 1}",
                    )
                    parts.append(r["CopyPartResult"]["ETag"])
                view, step = memoryview(data), max(self.multipart_bytes, MIN_PART_BYTES)
                for at in range(0, len(data), step):
                    r = self.client.upload_part(
                        Bucket=self.bucket,
                        Key=full,
                        UploadId=upload,
                        PartNumber=len(parts) + 1,
                        Body=bytes(view[at : at + step]),
                    )
                    parts.append(r["ETag"])
                self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=full,
                    UploadId=upload,
                    MultipartUpload={"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(parts)]},
                )
            except BaseException:
                # nothing appears: an upload is visible only once completed
                try:
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload)
                except Exception:
                    pass
                raise

    def create(self, key: str, data: bytes) -> None:
        from botocore.exceptions import ClientError

        full = self._name(key)
        with self._errors(key):
            try:
                # A conditional write (AWS S3 since 2024, SeaweedFS, MinIO): 412 if the key
                # exists, 409 while another conditional write of it is in flight. One PUT:
                # what is created this way is small (a version's manifest).
                self.client.put_object(Bucket=self.bucket, Key=full, Body=data, IfNoneMatch="*")
            except ClientError as e:
                code = error_code(e)
                if code in ("PreconditionFailed", "412"):
                    self._create_refused(key, data)
                    return
                if code in ("ConditionalRequestConflict", "409"):  # another create of it in flight
                    raise ObjectExists(f"{self.url_for(key)} exists already (another writer created it)") from None
                raise

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(prefix)
        root = f"{self.prefix}/" if self.prefix else ""
        out: list[ObjectInfo] = []
        with self._errors(prefix):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=root + prefix)
            for page in pages:
                for obj in page.get("Contents", ()):
                    if not obj["Key"].endswith("/"):  # folder markers made by consoles
                        modified = int(obj["LastModified"].timestamp() * 1000) if "LastModified" in obj else 0
                        out.append(ObjectInfo(obj["Key"][len(root) :], obj["Size"], modified))
        # S3 lists in UTF-8 byte order, but not every S3-compatible server does.
        out.sort(key=lambda o: o.key)
        return out

    def _stat(self, key: str) -> int | None:
        from botocore.exceptions import ClientError

        full = self._name(key)
        with self._errors(key):
            try:
                return int(self.client.head_object(Bucket=self.bucket, Key=full)["ContentLength"])
            except ClientError as e:
                if error_code(e) in ("404", "NoSuchKey", "NotFound"):
                    return None
                raise

    def delete(self, key: str) -> None:
        full = self._name(key)
        with self._errors(key):
            self.client.delete_object(Bucket=self.bucket, Key=full)

    def delete_many(self, keys: builtins.list[str]) -> int:
        root = f"{self.prefix}/" if self.prefix else ""
        for key in keys:
            check_key(key)
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
        return S3Storage(self.bucket, self._name(prefix), client=self._client)
