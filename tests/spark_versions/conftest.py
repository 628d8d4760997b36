"""Fixtures of the Spark version matrix: one local[2] session, one generated source and its
in-process compaction (the reference every version's archive must equal).

keyfill comes from the environment's installation (what a cluster library is), never from
this checkout: the checkout goes at the end of the path, for the `tests` helpers only, and a
test fails if keyfill's packages come from it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT))  # after site-packages: keyfill as installed, `tests.records` from here
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

SOURCE = dict(records=20_000, keys=400, partitions=4, chunk_records=2_500, headers=True, seed=5, rate=200.0)
COMPACT = dict(groups=4, slice_duration="10s", seal_all=True)


@pytest.fixture(scope="session")
def spark():
    from compactor.spark_session import local_spark

    session = local_spark("local[2]", app="keyfill-spark-versions", driver_memory="1g", progress=False)
    session.sparkContext.setLogLevel("ERROR")
    session.conf.set("spark.sql.shuffle.partitions", "4")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def source(tmp_path_factory) -> str:
    """The generated source; in $KEYFILL_SPARK_VERSIONS_WORK when set, so that every version's
    run reads it at the same URL (the archive id is a digest of the source, URL included)."""
    from keyfill.synth.generate import GeneratorConfig, generate

    work = os.environ.get("KEYFILL_SPARK_VERSIONS_WORK")
    url = os.path.join(work, "source") if work else str(tmp_path_factory.mktemp("matrix") / "source")
    generate(GeneratorConfig(out=url, overwrite=True, **SOURCE), progress=False)
    return url


@pytest.fixture(scope="session")
def reference(source, tmp_path_factory) -> dict:
    """The in-process compaction's canonical files (tests.records.canonical_files)."""
    from compactor.job import CompactConfig, compact
    from tests.records import canonical_files

    dest = str(tmp_path_factory.mktemp("matrix") / "reference")
    compact(CompactConfig(source=source, dest=dest, **COMPACT))
    return canonical_files(dest, assignment_rows=True)


@pytest.fixture(scope="session")
def compacted(spark, source, tmp_path_factory) -> str:
    """The source compacted on this Spark."""
    from compactor.job import CompactConfig, compact

    dest = str(tmp_path_factory.mktemp("matrix") / "compacted")
    compact(CompactConfig(source=source, dest=dest, **COMPACT), spark)
    return dest
