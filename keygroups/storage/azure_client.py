"""The azure-storage-blob client an Azure store builds in the process that uses it: the
account's credentials, a connection pool sized for the threads, and every wait bounded
(connect and read timeouts, and a deadline across the attempts: `StoreLimits`)."""

from __future__ import annotations

import logging
import os
import random
import time
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qs, urlparse, urlsplit

from keygroups.errors import StorageError
from keygroups.storage.clients import LazyClient
from keygroups.storage.limits import DeadlineExceeded, StoreLimits

# Uploads above this go up as staged blocks of this size, committed at once (the SDK's
# default single PUT reaches 64 MiB, a long wait with nothing to retry but all of it).
UPLOAD_PART_BYTES = 16 << 20
# Attempts until the deadline ends the request (`StoreLimits.retry_wait` cuts the last wait),
# as on every store: a count ended a throttled read with the SDK's error instead.
RETRY_TOTAL = 100
MAX_BACKOFF_S = 20.0  # botocore's cap on one wait
STORAGE_SCOPE = "https://storage.azure.com/.default"
_NEEDS = "Azure URLs need azure-storage-blob: pip install 'keyfill[azure]'"


def _deadline_hook(limits: StoreLimits) -> Any:
    """A per-attempt hook (azure-storage-blob's `raw_request_hook` runs inside its retry
    loop) that refuses a retry that could not finish in time: the SDK bounds attempts, not
    their sum."""

    def hook(request: Any) -> None:
        ctx = request.context
        now = time.monotonic()
        attempt = ctx["keyfill_attempt"] = ctx.get("keyfill_attempt", 0) + 1
        # the object's URL for a refusal's message; a SAS's signature stays out
        ctx["keyfill_url"] = urlsplit(request.http_request.url)._replace(query="").geturl()
        if not limits.may_send(ctx, attempt, now, int(request.http_request.headers.get("Content-Length") or 0)):
            raise _refusal(ctx, now, attempt - 1)

    return hook


def _refusal(ctx: Any, now: float, attempts: int) -> DeadlineExceeded:
    last = "each failed or went unanswered"  # the SDK's hooks see requests, not their outcomes
    where = ctx.get("keyfill_url", "Azure")
    return DeadlineExceeded(DeadlineExceeded.message(now - ctx["keyfill_started"], attempts, where, last))


def _retry_policy(limits: StoreLimits) -> Any:
    """azure-storage-blob's exponential retry that retries 429 Too Many Requests too: the SDK's
    own policy retries 408 and 5xx (Azure Storage throttles with 503 ServerBusy) and hands a
    429 back at once, as a front end or proxy before the account sends it. A 429 is retried
    on the same counters as the SDK's retries of the request, and the deadline hook bounds it
    alike."""
    from azure.storage.blob import ExponentialRetry

    class ThrottledRetry(ExponentialRetry):
        def configure_retries(self, request: Any) -> dict[str, Any]:
            # once per request: the loop below resumes the SDK's with the same counters
            settings: dict[str, Any] | None = request.context.get("keyfill_retries")
            if settings is None:
                settings = request.context["keyfill_retries"] = super().configure_retries(request)
                settings["keyfill_context"] = request.context
            return settings

        def sleep(self, settings: dict[str, Any], transport: Any) -> None:
            # the backoff cut to what leaves the next attempt time to finish by the deadline
            # (`StoreLimits.retry_wait`), or the request's end when none could
            ctx = settings.get("keyfill_context") or {}
            if "keyfill_started" not in ctx:
                super().sleep(settings, transport)  # type: ignore[no-untyped-call]
                return
            now = time.monotonic()
            wait = limits.wait_before(ctx, ctx.get("keyfill_attempt", 0) + 1, now, self.get_backoff_time(settings))
            if wait is None:
                raise _refusal(ctx, now, settings["count"])
            if wait > 0:
                transport.sleep(wait)

        def get_backoff_time(self, settings: dict[str, Any]) -> float:
            # The SDK counts the retry about to start from 1 (increment() runs before the
            # wait), so its first wait was initial_backoff + increment_base (2.5 s here), its
            # last 16.5 s: counted from 0, the waits are the ones below.
            wait = float(super().get_backoff_time({**settings, "count": settings["count"] - 1}))
            # capped as botocore caps it, keeping a spread so that throttled clients do not retry in step
            return wait if wait < MAX_BACKOFF_S else MAX_BACKOFF_S * random.uniform(0.75, 1.0)

        def send(self, request: Any) -> Any:
            while True:
                response = super().send(request)  # type: ignore[no-untyped-call]  # the SDK's loop: 5xx, 408, no answer
                if response.http_response.status_code != 429:
                    return response
                settings = self.configure_retries(request)
                if not self.increment(settings, request=request.http_request, response=response.http_response):
                    return response
                self.sleep(settings, request.context.transport)

    # The SDK's default waits 15 s before its first retry, longer than a whole request may
    # take here; this waits about 0.5, 2.5, 4.5, 8.5 and 16.5 s (with jitter), then 20 s, as
    # botocore's standard mode does. The SDK annotates these two as int; it computes with floats.
    return ThrottledRetry(
        initial_backoff=0.5,  # type: ignore[arg-type]
        increment_base=2,
        retry_total=RETRY_TOTAL,
        retry_connect=RETRY_TOTAL,  # each kind of failure is counted apart too, three by default
        retry_read=RETRY_TOTAL,
        retry_status=RETRY_TOTAL,
        random_jitter_range=0.5,  # type: ignore[arg-type]
    )


def connection_fields() -> dict[str, str]:
    """The `Name=value` fields of AZURE_STORAGE_CONNECTION_STRING (none when it is unset)."""
    raw = os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
    pairs = (part.split("=", 1) for part in raw.split(";") if "=" in part)
    return {k.strip(): v.strip() for k, v in pairs}


def connection_string_account() -> str:
    """The account of AZURE_STORAGE_CONNECTION_STRING: its AccountName, or for a SAS string
    without one the first label of its BlobEndpoint's host ("" when none is set)."""
    fields = connection_fields()
    if fields.get("AccountName"):
        return fields["AccountName"]
    host = urlparse(fields.get("BlobEndpoint", "")).hostname or ""
    return host.split(".")[0] if host.count(".") >= 2 else ""


class AzureClient(LazyClient):
    """A BlobServiceClient for one account. Credentials, in order: the connection string
    in AZURE_STORAGE_CONNECTION_STRING (the emulator's, an account key's or a SAS's);
    AZURE_STORAGE_KEY (account key); AZURE_STORAGE_SAS_TOKEN; otherwise azure-identity's
    DefaultAzureCredential (environment, workload identity, managed identity, Azure CLI)."""

    ENV_PREFIXES = ("AZURE_", "IDENTITY_", "MSI_")

    def __init__(self, threads: int, account: str, suffix: str = "core.windows.net", *, copied: bool = False) -> None:
        super().__init__(threads, copied=copied)
        self.account = account
        self.suffix = suffix
        self.copy_from_url = True  # Put Block From URL, until the endpoint says it has none

    def settings(self) -> tuple[str, str]:
        return (self.account, self.suffix)

    def _make(self) -> Any:
        try:
            import requests
            import requests.adapters
            from azure.core.pipeline.transport import RequestsTransport
            from azure.storage.blob import BlobServiceClient
        except ImportError as e:
            raise StorageError(f"{_NEEDS} ({e})") from None
        session = requests.Session()
        # The SDK's session keeps 10 connections and retries nothing itself (its policy does).
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=self.pool_size(), max_retries=0)
        session.mount("https://", adapter)
        session.mount("http://", adapter)
        options: dict[str, Any] = {
            "transport": RequestsTransport(
                session=session,
                session_owner=False,
                connection_timeout=self.limits.connect_s,
                read_timeout=self.limits.read_s,
            ),
            "retry_policy": _retry_policy(self.limits),
            "raw_request_hook": _deadline_hook(self.limits),
            "max_single_put_size": UPLOAD_PART_BYTES,
            "max_block_size": UPLOAD_PART_BYTES,
        }
        conn = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
        if conn:
            return BlobServiceClient.from_connection_string(conn, **options)
        url = f"https://{self.account}.blob.{self.suffix}"
        return BlobServiceClient(url, credential=self._credential(), **options)

    def _credential(self) -> Any:
        key = os.environ.get("AZURE_STORAGE_KEY")
        if key:
            return {"account_name": self.account, "account_key": key}
        sas = os.environ.get("AZURE_STORAGE_SAS_TOKEN")
        if sas:
            from azure.core.credentials import AzureSasCredential

            return AzureSasCredential(sas.lstrip("?"))
        try:
            from azure.identity import DefaultAzureCredential
        except ImportError:
            raise StorageError(
                f"no Azure credentials for account {self.account!r}: set AZURE_STORAGE_CONNECTION_STRING, "
                "AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN, or pip install azure-identity for Entra ID"
            ) from None
        credential = DefaultAzureCredential()
        # Ask for a token now, once: inside a request the SDK's retry policy would try the
        # whole credential chain again on every attempt (half a minute where there is none),
        # and azure-identity would log each failure at length; we report it in one line.
        quiet = logging.getLogger("azure.identity")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        try:
            credential.get_token(STORAGE_SCOPE)
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise StorageError(
                f"no Azure credentials found for account {self.account!r} ({first}): set "
                "AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN, or sign in "
                "(az login, a managed or workload identity, AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET)"
            ) from None
        finally:
            quiet.setLevel(level)
        return credential


def credential_origin(now: datetime | None = None) -> str:
    """Where this process's Azure credential comes from, in the order `AzureClient` takes
    them, for an error that says access was denied; a SAS says when it expires or expired
    (its `se` field): a SAS with a short life ends in the middle of a long run."""
    if os.environ.get("AZURE_STORAGE_CONNECTION_STRING"):
        sas = connection_fields().get("SharedAccessSignature")
        return _sas_origin("AZURE_STORAGE_CONNECTION_STRING", sas, now) if sas else "AZURE_STORAGE_CONNECTION_STRING"
    if os.environ.get("AZURE_STORAGE_KEY"):
        return "AZURE_STORAGE_KEY"
    sas = os.environ.get("AZURE_STORAGE_SAS_TOKEN")
    if sas:
        return _sas_origin("AZURE_STORAGE_SAS_TOKEN", sas, now)
    return "azure-identity's DefaultAzureCredential"


def _sas_origin(variable: str, sas: str, now: datetime | None) -> str:
    expiry = parse_qs(sas.lstrip("?")).get("se", [""])[0]
    try:
        ends = datetime.fromisoformat(expiry.replace("Z", "+00:00"))
    except ValueError:
        return f"a SAS in {variable}"
    if ends.tzinfo is None:
        ends = ends.replace(tzinfo=timezone.utc)
    passed = ends <= (now or datetime.now(timezone.utc))
    return f"a SAS in {variable} that {'expired' if passed else 'expires'} at {expiry}"
