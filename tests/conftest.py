"""Shared fixtures: a real S3 server (SeaweedFS) and fresh storage roots on both backends.

The server starts lazily, on the first test that asks for S3, so `pytest -k local` never
pays for it; it is never skipped: if it cannot start, the tests that need it error.
"""

from __future__ import annotations

import uuid

import pytest

from keyfill.testing.s3server import S3Server


@pytest.fixture(scope="session")
def s3_server(keyfill_s3: S3Server) -> S3Server:
    """One SeaweedFS for the session: keyfill.testing's own fixture (its pytest plugin), so a
    test that asks for both names gets one server. The AWS variables go into os.environ (not
    just a client) so that subprocesses such as Spark's Python workers find the server too."""
    return keyfill_s3


@pytest.fixture
def s3_url(s3_server: S3Server) -> str:
    """A fresh, empty ``s3://bucket/<unique prefix>`` root."""
    return f"s3://{s3_server.bucket}/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def local_url(tmp_path) -> str:
    """A fresh, empty local folder."""
    root = tmp_path / "store"
    root.mkdir()
    return str(root)


@pytest.fixture(params=["local", "s3"])
def storage_url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty root on each backend: storage-touching tests run on both."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture(scope="session")
def spark(s3_server):
    """One real local[2] Spark for the session (a cold start costs 10-15 s). It starts after
    the S3 server so its Python workers inherit the AWS environment."""
    from compactor.spark_session import local_spark

    session = local_spark("local[2]", app="keyfill-tests", driver_memory="2g", progress=False)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
