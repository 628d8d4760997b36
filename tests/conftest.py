"""Shared fixtures: real object-store servers (SeaweedFS for S3, fake-gcs-server for GCS,
Azurite for Azure) and fresh storage roots on each backend.

Each server starts lazily, on the first test that asks for it, so `pytest -k local` never
pays for one; none is ever skipped: if one cannot start, the tests that need it error.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import settings

from keyfill.testing.s3server import S3Server

# No verdict may depend on the machine's speed (CONTRIBUTING.md, "The suite"): hypothesis' default deadline
# (200 ms an example) fails a test on a busy machine as DeadlineExceeded or "Unreliable test
# timings". Every property test here sets deadline=None; this profile covers one that forgets.
settings.register_profile("keyfill-tests", deadline=None)
settings.load_profile("keyfill-tests")

# Every Spark driver the tests start (the session's, and the CLI's and spark-submit's in
# subprocesses, which inherit the variable) compiles with the JVM's quick compiler only: the
# tests' data are tiny, and on two cores the optimising compiler's threads took the CPU the
# tests wait on (tests/test_spark_source.py: 151 s -> 140 s idle, 186-211 s -> 142-158 s
# beside another test run). The serial collector likewise: a 2 GB heap needs no parallel
# collector threads, which took CPU the other test process needed (test_kafka_live and
# test_spark_source: 207 s -> 193 s). Users' jobs keep the JVM's defaults.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
# Every such driver reads tests/spark-conf/spark-defaults.conf: the time-based Spark settings a
# busy machine can trip, made explicit and generous there (the file says which, and what Spark
# fixes with no setting). Their Python workers run this interpreter, whatever the shell
# exported (another checkout's fails to connect back, or runs other code), through
# tests/spark-conf/worker-python: with pyspark's byte-compiled modules, so a new worker meets
# Spark's fixed 10 s to connect back on a busy machine too (the script says how).
SPARK_CONF = Path(__file__).resolve().parent / "spark-conf"
os.environ.setdefault("SPARK_CONF_DIR", str(SPARK_CONF))
os.environ["SPARK_AUTH_SOCKET_TIMEOUT"] = "120"  # spark-defaults.conf's socket bound, on the driver's Python side
os.environ["KEYFILL_TESTS_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["PYSPARK_PYTHON"] = str(SPARK_CONF / "worker-python")

# Tiers (CONTRIBUTING.md): each test is marked with what it needs, from the fixtures it asks for
# (below) or by hand where it starts the thing itself (`pytest.mark.spark`, ...); `make
# test-fast` deselects them all and starts neither a JVM nor a server.
NEEDS = {
    "spark": {"spark", "keyfill_spark"},
    "connect": {"connect", "connect_server", "keyfill_connect"},
    "stores": {
        "s3_server", "s3_url", "keyfill_s3", "keyfill_s3_url",
        "gcs_server", "gcs_url", "keyfill_gcs", "keyfill_gcs_url",
        "azure_server", "azure_url", "keyfill_azure", "keyfill_azure_url",
    },
    "kafka": {"keyfill_kafka"},
    "slow": {"seeded_packages"},  # builds the numba seed in a subprocess: 20-25 s
}  # fmt: skip
PARAMETRIZED_STORES = ("storage_url", "any_store_url", "backend")  # their params other than "local" start a server
# `make test-fast`: a test that starts a server it is not marked for fails, naming the mark it lacks
# (a JVM cannot start there at all: JAVA_HOME points nowhere).
FAST = os.environ.get("KEYFILL_TESTS_FAST") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for mark, fixtures in NEEDS.items():
            if names & fixtures:
                item.add_marker(mark)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if any(params.get(name, "local") != "local" for name in PARAMETRIZED_STORES):
            item.add_marker("stores")
        for mark, fixtures in NEEDS.items():  # a fixture named by a parameter (request.getfixturevalue)
            if any(isinstance(v, str) and v in fixtures for v in params.values()):
                item.add_marker(mark)
        if item.get_closest_marker("connect"):
            item.add_marker("spark")


def _no_server(what: str, mark: str):  # type: ignore[no-untyped-def]
    def refuse() -> str:
        raise RuntimeError(f"make test-fast starts no {what}: mark the test `pytest.mark.{mark}` (CONTRIBUTING.md)")

    return refuse


if FAST:
    import keyfill.testing.azurite
    import keyfill.testing.gcsserver
    import keyfill.testing.kafka_broker
    import keyfill.testing.s3server

    keyfill.testing.s3server.weed_binary = _no_server("S3 server", "stores")
    keyfill.testing.gcsserver.fake_gcs_binary = _no_server("GCS server", "stores")
    keyfill.testing.azurite.azurite_binary = _no_server("Azure server", "stores")
    keyfill.testing.kafka_broker.tansu_binary = _no_server("Kafka broker", "kafka")


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


@pytest.fixture(scope="session")
def gcs_server(keyfill_gcs):
    return keyfill_gcs


@pytest.fixture(scope="session")
def azure_server(keyfill_azure):
    return keyfill_azure


@pytest.fixture
def gcs_url(keyfill_gcs_url: str) -> str:
    """A fresh, empty ``gs://bucket/<unique prefix>`` root."""
    return keyfill_gcs_url


@pytest.fixture
def azure_url(keyfill_azure_url: str) -> str:
    """A fresh, empty ``az://container/<unique prefix>`` root."""
    return keyfill_azure_url


@pytest.fixture
def local_url(tmp_path) -> str:
    """A fresh, empty local folder."""
    root = tmp_path / "store"
    root.mkdir()
    return str(root)


@pytest.fixture(params=["local", "s3"])
def storage_url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty root on the local and the S3 backend: the components' storage tests
    run on both (the other stores keep the same contract: `any_store_url`)."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture(params=["local", "s3", "gcs", "azure"])
def any_store_url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty root on every backend: the storage contract runs on each."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture(scope="session")
def spark(s3_server, gcs_server, azure_server):
    """One real local[2] Spark for the session (a cold start costs 10-15 s). It starts after
    the object-store servers so its Python workers inherit their environment."""
    from compactor.spark_session import local_spark

    session = local_spark("local[2]", app="keyfill-tests", driver_memory="2g", progress=False)
    session.sparkContext.setLogLevel("ERROR")
    # 4 shuffle partitions, as the README submits jobs on small data: a stateful streaming
    # query keeps a state store per partition and micro-batch, and the tests' topics are tiny
    # (test_kafka_live and test_spark_source: 225 s -> 207 s against the session default of 16)
    session.conf.set("spark.sql.shuffle.partitions", "4")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def full_source(tmp_path_factory):
    """A generated source whose chunk files tests copy over in steps (tests.records.copy_share):
    a source that grows as an archiving connector writes it."""
    from keyfill.synth.generate import GeneratorConfig, generate

    src = str(tmp_path_factory.mktemp("grown") / "full")
    generate(
        GeneratorConfig(
            out=src, records=12_000, keys=300, partitions=3, chunk_records=1_000, skew=1.1, rate=100.0, seed=8
        ),
        progress=False,
    )
    return src


@pytest.fixture(scope="session")
def seeded_packages(tmp_path_factory) -> tuple[Path, dict]:
    """keyfill's packages copied out of the checkout with a numba seed built in them (what
    `make wheel` ships), and the seed's manifest. Compiling every kernel takes most of a
    minute, so the run builds it once: pytest-xdist's workers share it under a lock. Users
    copy the tree; nobody changes it."""
    from keyfill.numba_warm import PACKAGES, build_seed

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this run's, whichever worker
    root, done = shared / "numba-seed", shared / "numba-seed.json"
    with open(shared / "numba-seed.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc", "_numba_cache")
            shutil.rmtree(root, ignore_errors=True)
            for package in PACKAGES:
                shutil.copytree(Path(__file__).resolve().parents[1] / package, root / package, ignore=skip)
            done.write_text(json.dumps(build_seed(root)))
    return root, json.loads(done.read_text())


@pytest.fixture(scope="session")
def connect_server(s3_server):
    """pyspark's own Spark Connect server, in a process of its own, for the session (a
    start costs 5-30 s). Its environment is this process's without the S3 server's
    credentials, as a cluster's is not a client's laptop: archives on local paths (which the
    server shares with the tests) work through it, and an s3:// archive shows what a user
    meets whose cluster lacks the client's credentials."""
    from keyfill.testing.connect_server import start_connect_server

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    # nothing else to find credentials in: no profile files, no instance metadata service
    env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_EC2_METADATA_DISABLED="true")
    server = start_connect_server(
        conf={"spark.sql.shuffle.partitions": "4", "spark.driver.memory": "2g", "spark.sql.session.timeZone": "UTC"},
        env=env,
    )
    with server:
        yield server


@pytest.fixture(scope="session")
def connect(connect_server):
    """A Spark Connect client in a process of its own (PySpark runs one kind of session per
    process, and this one runs the classic `spark`): `connect.run(f, *args)` calls
    `f(session, *args)` there, `session` a Connect session with format("keyfill") registered.
    Tests that use it carry `tests.connect_client.CONNECT`: one worker runs them all."""
    from tests.connect_client import Client

    with Client(connect_server.url) as client:
        yield client
