"""keyfill shipped to a cluster as users ship it: `spark-submit --py-files keyfill-*.whl
jobs/compact.py` on `local-cluster[2,1,1024]`, two executor JVMs with Python workers of
their own apart from the driver, sharing only storage with it; then the audit in Spark and
a batch read of the `format("keyfill")` source, the same way.

keyfill is installed in the test environment (editable), so the driver and the workers run a
Python that does not read this environment's .pth files (`-S`): they find pyspark, numba and
the other dependencies in site-packages, and keyfill only in the shipped wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from compactor.job import CompactConfig, compact
from compactor.sources import open_source
from compactor.verify import verify
from keyfill.cli import jobs
from keyfill.synth.generate import GeneratorConfig, generate
from keygroups import compacted
from keygroups.storage import open_storage
from tests.records import canonical_files
from tests.test_reader import source_table

pytestmark = pytest.mark.spark  # spark-submit on a local-cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def wheel(seeded_packages, tmp_path_factory) -> str:
    """The wheel `make wheel` builds: numba's kernels compiled inside (keygroups/_numba_seed.py),
    so the executors' Python workers load them instead of compiling them."""
    built, manifest = seeded_packages
    assert manifest["not_compiled"] == []
    out, project = tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("project") / "keyfill"
    shutil.copytree(built, project)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), project / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(project)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (found,) = [f for f in os.listdir(out) if f.startswith("keyfill-") and f.endswith(".whl")]
    with zipfile.ZipFile(out / found) as z:
        assert "keygroups/_numba_cache/seed.json" in z.namelist()  # package data reaches the wheel
    return str(out / found)


def python_without_keyfill(folder) -> str:
    """This interpreter, with site-packages on its path but no .pth file read, so the
    editable install of keyfill is invisible. Started as every test worker is
    (tests/spark-conf/worker-python): pyspark byte-compiled from site-packages, not from the
    zip Spark puts first on a worker's path, so the driver's streaming source worker connects
    back within Spark's fixed 10 s on a busy machine too."""
    path = folder / "python"
    path.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{sysconfig.get_paths()["purelib"]}" '
        f'exec {os.path.join(ROOT, "tests", "spark-conf", "worker-python")} -S "$@"\n'
    )
    path.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run(
        [str(path), "-c", "import pyarrow, numba\nimport keygroups"],
        capture_output=True,
        text=True,
        cwd=folder,
        env=env,
    )
    assert "No module named 'keygroups'" in probe.stderr, probe.stderr  # dependencies yes, keyfill no
    return str(path)


def spark_submit(wheel: str, folder, script: str, *args: str) -> subprocess.CompletedProcess:
    python = python_without_keyfill(folder)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME")}
    env |= {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
    submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    return subprocess.run(
        [submit, "--master", "local-cluster[2,1,1024]", "--conf", "spark.log.level=WARN", "--py-files", wheel]
        + ["--conf", "spark.sql.shuffle.partitions=4"]  # as the README submits jobs on small data
        # the executors' JVMs live a minute, as the driver's (SPARK_SUBMIT_OPTS, tests/conftest.py)
        + ["--conf", f"spark.executor.extraJavaOptions={os.environ.get('SPARK_SUBMIT_OPTS', '')}"]
        + [script, *args],
        capture_output=True,
        text=True,
        cwd=folder,  # not the checkout: keyfill must come from the wheel
        env=env,
        timeout=900,
    )


def test_spark_submit_with_the_wheel_compacts_verifies_and_reads_on_separate_executors(wheel, tmp_path):
    src, dest = str(tmp_path / "src"), str(tmp_path / "compacted")
    generate(
        GeneratorConfig(out=src, records=12_000, keys=200, partitions=3, chunk_records=2_000, seed=5), progress=False
    )
    # the job script where `keyfill jobs compact` says it is, run by a driver that then audits
    # and reads the archive in the same application (one start of the executors)
    job = os.path.join(ROOT, "tests", "cluster_job.py")
    options = ("--groups", "4", "--slice-duration", "1s", "--seal-all", "--json")
    done = spark_submit(wheel, tmp_path, job, jobs.path("compact"), src, dest, *options)
    assert done.returncode == 0, done.stderr[-4000:]
    printed, last = done.stdout.strip().rsplit("\n", 1)
    result = json.loads(printed)  # --json: the compaction's result alone on stdout, logs on stderr
    manifest = compacted.load_manifest(open_storage(dest))
    assert manifest.totals.records == result["records"] == 12_000 and manifest.groups == 4 and manifest.slices > 3
    report = verify(open_source(src), open_storage(dest))
    assert report.ok, report.violations
    # invariant 6 across executors: the bytes the in-process compactor writes (tests/test_determinism.py
    # varies local[1], local[2], shuffle partitions, chunk order and the hash seed)
    here = str(tmp_path / "in-process")
    compact(CompactConfig(source=src, dest=here, groups=4, slice_duration="1s", seal_all=True))
    assert canonical_files(dest) == canonical_files(here)

    # the audit in Spark, a batch read and a streaming read of the source, on the executors
    got = json.loads(last)
    assert got["verified"], got["violations"]
    assert got["executors"] == 2
    assert got["records"] == 12_000
    assert got["offset_sum"] == sum(source_table(src).column("offset").to_pylist())
    assert (got["streamed_records"], got["streamed_offset_sum"]) == (got["records"], got["offset_sum"])
    assert got["triggers"] >= manifest.slices / 3  # micro-batches of at most 3 slices, planned by the driver's worker
