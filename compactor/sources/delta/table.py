"""Opening a Delta table the way `--format delta` names it, with delta-rs's storage options
taken from the settings keyfill's storage layer already reads: an S3 endpoint, a GCS
emulator, an Azure connection string, key or SAS token."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from compactor.errors import ArchiveError
from keygroups.storage.azure_client import connection_fields

if TYPE_CHECKING:  # deltalake is imported where a table is opened
    from deltalake import DeltaTable


def delta_location(url: str) -> str:
    """A table URL as delta-rs takes it: local paths absolute, s3a/s3n as s3, wasbs as abfss."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return os.path.abspath(url)
    if scheme.lower() == "file":
        return os.path.abspath(rest)
    if scheme.lower() in ("s3a", "s3n"):
        return "s3://" + rest
    if scheme.lower() in ("wasb", "wasbs"):  # the Blob endpoint's name of an ADLS Gen2 account
        return "abfss://" + rest.replace(".blob.", ".dfs.", 1)
    return url


def storage_options(location: str) -> dict[str, str]:
    """What delta-rs's object store does not take from the standard environment itself, for
    the settings keyfill's storage layer reads (docs/storage.md)."""
    scheme = location.partition("://")[0]
    if scheme == "gs":
        return _gcs_options()
    if scheme in ("az", "abfs", "abfss"):
        return _azure_options(location)
    if scheme != "s3":
        return {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    opts = {}
    if endpoint:
        opts["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
    return opts


def open_table(location: str, version: int | None) -> DeltaTable:
    from deltalake import DeltaTable

    try:
        return DeltaTable(location, version=version, storage_options=storage_options(location))
    except Exception as exc:  # delta-rs raises OSError, TableNotFoundError, DeltaError: all say why
        at = f" at version {version}" if version is not None else ""
        raise ArchiveError(f"{location}: cannot read the Delta table{at}: {exc}") from None


def _gcs_options() -> dict[str, str]:
    """An emulator named by STORAGE_EMULATOR_HOST (the Google SDK's switch): object_store
    takes its address, and no OAuth, from a service-account key; elsewhere delta-rs finds
    GOOGLE_APPLICATION_CREDENTIALS or the metadata server itself."""
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if not emulator:
        return {}
    base = emulator if "://" in emulator else f"http://{emulator}"
    key = {"gcs_base_url": base, "disable_oauth": True, "client_email": "", "private_key": "", "private_key_id": ""}
    return {"google_service_account_key": json.dumps(key)}


def _azure_options(location: str) -> dict[str, str]:
    """The account and credential keyfill's Azure client would use: a connection string's
    fields (the emulator's endpoint among them), else AZURE_STORAGE_KEY or
    AZURE_STORAGE_SAS_TOKEN; without them delta-rs's own chain (Azure CLI, managed and
    workload identity) signs in."""
    opts: dict[str, str] = {}
    host = urlparse(location).hostname or ""
    if "@" in location.split("/")[2]:  # abfss://container@account.dfs.core.windows.net/...
        opts["account_name"] = host.split(".")[0]
    fields = connection_fields()
    if fields:
        if fields.get("AccountName"):
            opts["account_name"] = fields["AccountName"]
        if fields.get("AccountKey"):
            opts["account_key"] = fields["AccountKey"]
        if fields.get("SharedAccessSignature"):
            opts["sas_token"] = fields["SharedAccessSignature"]
        endpoint = fields.get("BlobEndpoint")
        if endpoint:
            opts["endpoint"] = endpoint
            if endpoint.startswith("http://"):
                opts["allow_http"] = "true"
        return opts
    if os.environ.get("AZURE_STORAGE_KEY"):
        opts["account_key"] = os.environ["AZURE_STORAGE_KEY"]
    elif os.environ.get("AZURE_STORAGE_SAS_TOKEN"):
        opts["sas_token"] = os.environ["AZURE_STORAGE_SAS_TOKEN"].lstrip("?")
    return opts
