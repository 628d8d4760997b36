"""The examples of docs/testing.md run as written: the plain Python job's, and the Spark
query's (jobs/fraud_backfill.py's own `fraud_windows`, on the suite's local[2] session)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import reader.spark

DOC = Path(__file__).resolve().parent.parent / "docs" / "testing.md"


def _block(n: int, tmp_path: Path):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 2
    path = tmp_path / f"docs_testing_example_{n}.py"  # a real file: hypothesis reads the test's source
    path.write_text(blocks[n])
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fraud_windows_example_of_the_docs_passes(tmp_path):
    _block(0, tmp_path).test_fraud_windows_backfill_as_they_run_live()


def test_the_spark_query_example_of_the_docs_passes(tmp_path, spark):
    reader.spark.register(spark)
    _block(1, tmp_path).test_fraud_query_backfills_the_windows_of_the_whole_topic(spark)
