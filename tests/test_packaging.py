"""keyfill shipped as a zip (`spark-submit --py-files keyfill-*.whl` puts the wheel on the
executors' sys.path as a zip): its packages load from a copy extracted once per machine
(keygroups._from_zip), so the compiled kernels run, and the next process loads them from
numba's cache instead of compiling again (numba cannot cache a source that is not a file)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import keygroups
import keygroups._numba as nb
import keygroups.envelope.snappy as snappy
import cramjam
assert '.zip' in keygroups.__file__ and not nb.FROM_ZIP, keygroups.__file__
assert snappy.__file__.startswith(sys.argv[2]), snappy.__file__
import numpy as np
data = bytes(range(256)) * 64
src = np.frombuffer(bytes(cramjam.snappy.compress_raw(data)), np.uint8)
starts, ends = np.array([0]), np.array([len(src)])
(n,) = snappy.snappy_lengths(src, starts, ends)
out = np.zeros(n + snappy.SLACK, np.uint8)
assert snappy.decompress_blocks(src, starts, ends, out, np.array([0]), np.array([n])) == -1
print(out[:n].tobytes() == data, sum(snappy.decompress_blocks.stats.cache_hits.values()))
"""


def test_the_kernels_run_from_a_zip(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    archive = tmp_path / "keyfill.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for folder, _, files in os.walk(os.path.join(root, "keygroups")):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    z.write(path, os.path.relpath(path, root))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NUMBA_CACHE_DIR")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    hits = []
    for _ in range(2):  # the first process compiles, the second loads the first's cache
        done = subprocess.run(
            [sys.executable, "-c", PROBE, str(archive), str(tmp_path / "cache" / "keyfill" / "code")],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=600,
        )
        assert done.returncode == 0 and done.stdout.split()[0] == "True", done.stderr[-2000:]
        hits.append(int(done.stdout.split()[1]))
    assert hits[0] == 0 and hits[1] > 0


def test_the_pytest_plugin_loads_nothing_a_plain_install_lacks(tmp_path):
    """pytest loads keyfill's plugin (the `pytest11` entry point) in every run of an
    environment keyfill is installed in: without the [testing] extra (no hypothesis), a
    user's own tests must still run, and the plugin must not import what a fixture would
    need only once used (numba, pyiceberg, hypothesis, pyspark). (The Spark version matrix
    runs its tests in environments without hypothesis: make test-spark-versions.)"""
    (tmp_path / "test_users_own.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    script = """
import sys

class Absent:  # hypothesis as if not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("hypothesis", "_hypothesis_pytestplugin"):
            raise ImportError(f"No module named {name!r}")

sys.meta_path.insert(0, Absent())
import pytest
code = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", sys.argv[1]])
loaded = "keyfill.testing.pytest_plugin" in sys.modules
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"numba", "pyiceberg", "pyspark", "hypothesis"})
print("exit", int(code), "plugin", loaded, "heavy", heavy)
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert done.stdout.strip().splitlines()[-1] == "exit 0 plugin True heavy []", done.stdout + done.stderr


def test_the_spark_api_names_are_those_it_looks_for():
    """reader.spark.api exports, for the type checker, the classes it looks up at run time
    by name: the two lists must stay one."""
    import reader.spark.api as spark_api

    looked_up = spark_api._CORE + spark_api._FILTERS + spark_api._LIMITS
    assert sorted(spark_api.__all__) == sorted(
        [*looked_up, "ADMISSION_CONTROL", "DATA_SOURCES", "FILTER_PUSHDOWN", "require_data_sources"]
    )
    assert all(isinstance(getattr(spark_api, n), type) for n in looked_up)
    assert spark_api.DATA_SOURCES and spark_api.FILTER_PUSHDOWN and spark_api.ADMISSION_CONTROL  # the newest PySpark
