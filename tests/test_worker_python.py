"""`keyfill worker-python`: the launcher a user gives Spark as its Python, so that a new
Python worker imports pyspark byte-compiled instead of compiling it from Spark's zip (and
connects back within Spark's fixed 10 s on a busy executor). The verdict is where pyspark
was imported from, in the process Spark starts for a streaming query's source and in a
read task's worker, not how fast either started."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from keyfill.cli import main
from keyfill.worker_python import build, spark_zips

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_copy_is_built_whole_under_its_name_without_the_tests(tmp_path):
    made = tmp_path / "m.zip"
    with zipfile.ZipFile(made, "w") as z:
        z.writestr("m/__init__.py", "X = 1\n")
        z.writestr("m/tests/test_m.py", "import nothing_at_all\n")
    target = str(tmp_path / "cache" / "m-1-2")
    build(str(made), target)
    assert os.path.isfile(os.path.join(target, "m", "__init__.py"))
    assert not os.path.exists(os.path.join(target, "m", "tests"))
    assert any(n.endswith(".pyc") for n in os.listdir(os.path.join(target, "m", "__pycache__")))
    assert sorted(os.listdir(tmp_path / "cache")) == ["m-1-2"]  # no scratch folder left beside it


def test_a_cache_that_cannot_be_written_leaves_sparks_zips(tmp_path):
    (tmp_path / "file").write_text("")
    launcher = str(tmp_path / "kp")
    assert main(["worker-python", launcher, "--cache", str(tmp_path / "file" / "cache")]) == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(spark_zips()), "KEYFILL_PYSPARK_BUILD": "now"}
    out = subprocess.run([launcher, "-c", "import pyspark; print(pyspark.__file__)"], env=env, capture_output=True)
    assert out.returncode == 0 and b"pyspark.zip" in out.stdout, out


def record_where_pyspark_is(out: str) -> None:
    """A streaming query whose source records `pyspark.__file__` in the process that plans
    it and in the worker of its read task (`python -c`, a Spark session of its own)."""
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    def note(name: str) -> None:
        import pyspark

        with open(os.path.join(out, name), "w") as f:
            f.write(pyspark.__file__ or "")

    class Reader(DataSourceStreamReader):
        def initialOffset(self) -> dict:
            note("planner")
            return {"at": 0}

        def latestOffset(self, start=None, limit=None) -> dict:
            return {"at": 1}

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition(0)] if start["at"] < end["at"] else []

        def read(self, partition):
            note("task")
            yield (1,)

    class Where(DataSource):
        @classmethod
        def name(cls) -> str:
            return "where"

        def schema(self) -> str:
            return "n int"

        def streamReader(self, schema):
            return Reader()

    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.dataSource.register(Where)
    query = spark.readStream.format("where").load().writeStream.format("noop")
    query.option("checkpointLocation", os.path.join(out, "checkpoint")).trigger(
        availableNow=True
    ).start().awaitTermination()
    spark.stop()


@pytest.mark.spark  # a streaming query in a subprocess
def test_a_streaming_query_beside_two_cpu_burners_imports_the_compiled_pyspark(tmp_path):
    """The documented setting, PYSPARK_PYTHON=<launcher>, on two busy cores: the streaming
    source's planning process and the read task's worker both import the cache's pyspark."""
    launcher, cache = str(tmp_path / "keyfill-python"), str(tmp_path / "cache")
    assert main(["worker-python", launcher, "--cache", cache]) == 0  # builds this pyspark's copies now
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        env = {**os.environ, "PYSPARK_PYTHON": launcher}
        call = f"from tests.test_worker_python import record_where_pyspark_is as r; r({str(tmp_path)!r})"
        done = subprocess.run(
            [sys.executable, "-c", call], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
        )
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert done.returncode == 0, done.stderr[-3000:]
    for process in ("planner", "task"):
        found = (tmp_path / process).read_text()
        assert found.startswith(cache + os.sep), (process, found)
