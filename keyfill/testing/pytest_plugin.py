"""Pytest fixtures for users' tests, loaded by pytest when keyfill[testing] is installed
(the `pytest11` entry point). Each starts what it needs only when a test asks for it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from keyfill.testing.azurite import AzuriteServer
    from keyfill.testing.connect_server import ConnectServer
    from keyfill.testing.gcsserver import GcsServer
    from keyfill.testing.kafka_broker import KafkaBroker
    from keyfill.testing.s3server import S3Server


@pytest.fixture(scope="session")
def keyfill_s3() -> Iterator[S3Server]:
    """A real S3 server (SeaweedFS) on 127.0.0.1 for the session, with the AWS variables set
    so boto3, keyfill and Spark's Python workers reach it. Yields the server: `.bucket`,
    `.endpoint`; `keyfill_s3_url` gives a fresh prefix."""
    from keyfill.testing.s3server import start_seaweedfs

    with start_seaweedfs() as server, server.applied_env():
        yield server


@pytest.fixture(scope="session")
def keyfill_gcs() -> Iterator[GcsServer]:
    """A GCS emulator (fake-gcs-server) on 127.0.0.1 for the session, with
    STORAGE_EMULATOR_HOST set so google-cloud-storage, keyfill and Spark's Python workers
    reach it. Yields the server: `.bucket`, `.endpoint`; `keyfill_gcs_url` gives a fresh prefix."""
    from keyfill.testing.gcsserver import start_fake_gcs

    with start_fake_gcs() as server, server.applied_env():
        yield server


@pytest.fixture(scope="session")
def keyfill_azure() -> Iterator[AzuriteServer]:
    """An Azure Blob Storage emulator (Azurite, from npm) on 127.0.0.1 for the session, with
    AZURE_STORAGE_CONNECTION_STRING set. Yields the server: `.container`, `.endpoint`;
    `keyfill_azure_url` gives a fresh prefix."""
    from keyfill.testing.azurite import start_azurite

    with start_azurite() as server, server.applied_env():
        yield server


@pytest.fixture(scope="session")
def keyfill_kafka() -> Iterator[KafkaBroker]:
    """A Kafka-compatible broker (tansu, in memory) on 127.0.0.1 for the session. Yields the
    broker: `.bootstrap`, `.create_topic(name, partitions)`, `.producer()`."""
    from keyfill.testing.kafka_broker import start_broker

    with start_broker() as broker:
        yield broker


@pytest.fixture
def keyfill_s3_url(keyfill_s3: S3Server) -> str:
    """A fresh, empty s3:// prefix on the test server: pass it as `check_job(url=...)`."""
    return f"s3://{keyfill_s3.bucket}/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def keyfill_gcs_url(keyfill_gcs: GcsServer) -> str:
    """A fresh, empty gs:// prefix on the GCS emulator."""
    return f"gs://{keyfill_gcs.bucket}/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def keyfill_azure_url(keyfill_azure: AzuriteServer) -> str:
    """A fresh, empty az:// prefix on Azurite (the account comes from its connection string)."""
    return f"az://{keyfill_azure.container}/t-{uuid.uuid4().hex[:12]}"


def spark_session(remote: str | None = None) -> SparkSession:
    """What `keyfill_spark` yields: a local[2] session, or with `remote` (default:
    SPARK_REMOTE) a Spark Connect session on that server; format("keyfill") registered."""
    import os

    import reader.spark
    from compactor.spark_session import local_spark
    from keygroups.spark_kind import set_log_level

    remote = remote or os.environ.get("SPARK_REMOTE") or None
    session = local_spark("local[2]", app="keyfill-testing", driver_memory="2g", progress=False, remote=remote)
    set_log_level(session, "ERROR")
    reader.spark.register(session)
    return session


@pytest.fixture(scope="session")
def keyfill_spark() -> Iterator[SparkSession]:
    """A local[2] Spark session with format("keyfill") registered (needs keyfill[spark]); with
    SPARK_REMOTE set, a Spark Connect session on that server instead (needs keyfill[connect]):
    the same tests then check a query as a Connect client runs it."""
    session = spark_session()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def keyfill_connect() -> Iterator[ConnectServer]:
    """A Spark Connect server (pyspark's own, needs keyfill[connect]) on 127.0.0.1 for the
    session, in a process of its own with this process's environment. Yields the server:
    `.url` (sc://127.0.0.1:<port>), for `SPARK_REMOTE` in a subprocess: PySpark runs one kind
    of session per process, so a test process with a classic session reaches it from another."""
    from keyfill.testing.connect_server import start_connect_server

    with start_connect_server() as server:
        yield server
