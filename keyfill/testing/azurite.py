"""Start a throwaway Azure Blob Storage emulator (Azurite, Microsoft's) on 127.0.0.1 for the
tests and the benchmarks.

Azurite is a Node.js program from the npm registry: `make test` installs it from the
repository's package.json and lock file into node_modules/. It runs in memory and answers
the Blob API keyfill uses (conditional uploads, block lists, ranged reads, paged listings,
batch deletes) but not Put Block From URL; what else it answers differently is in
docs/storage.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from keyfill.testing.servers import START_S, ScratchServer, free_port, start_retrying

CONTAINER = "keyfill-test"
ACCOUNT = "devstoreaccount1"
# The emulator's well-known account key, published in Azurite's documentation.
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_ISOLATE = ("AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_CLIENT_ID")


def azurite_binary() -> str:
    """`azurite-blob`: $KEYFILL_AZURITE, node_modules/.bin of this checkout or the working
    folder (where `npm ci` put it), or PATH."""
    named = os.environ.get("KEYFILL_AZURITE")
    if named:
        return named
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        path = root / "node_modules" / ".bin" / "azurite-blob"
        if os.access(path, os.X_OK):
            return str(path)
    found = shutil.which("azurite-blob")
    if found:
        return found
    raise RuntimeError("azurite-blob not found: run `npm ci` in the keyfill checkout (or npm install -g azurite)")


@dataclass
class AzuriteServer(ScratchServer):
    LOG = "azurite.log"

    endpoint: str  # the account's blob endpoint: http://127.0.0.1:P/devstoreaccount1
    container: str
    workdir: str
    process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def connection_string(self) -> str:
        return ";".join(
            ["DefaultEndpointsProtocol=http", f"AccountName={ACCOUNT}", f"AccountKey={ACCOUNT_KEY}"]
            + [f"BlobEndpoint={self.endpoint}", ""]
        )

    def env(self) -> dict[str, str | None]:
        env: dict[str, str | None] = {k: None for k in _ISOLATE}
        env["AZURE_STORAGE_CONNECTION_STRING"] = self.connection_string
        return env

    def create_container(self, name: str) -> None:
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient.from_connection_string(
            self.connection_string, retry_total=0, connection_timeout=2, read_timeout=5
        )
        try:
            service.create_container(name)
        except ResourceExistsError:
            pass  # a retried create after the first one landed


def _start_once(container: str, timeout: float) -> AzuriteServer:
    workdir = tempfile.mkdtemp(prefix="keyfill-azurite-")
    port = free_port()
    args = [azurite_binary(), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence"]
    # the current azure-storage-blob sends an API version newer than Azurite 3.35 knows
    args += ["--skipApiVersionCheck", "--disableTelemetry", "--silent"]
    with open(os.path.join(workdir, AzuriteServer.LOG), "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir)
    server = AzuriteServer(f"http://127.0.0.1:{port}/{ACCOUNT}", container, workdir, proc)
    server.await_ready(lambda: server.create_container(container), timeout, "Azurite (azurite-blob)")
    return server


def start_azurite(container: str = CONTAINER, *, timeout: float = START_S, tries: int = 3) -> AzuriteServer:
    """Start Azurite's blob service in memory and create ``container``."""
    return start_retrying(lambda: _start_once(container, timeout), tries)
