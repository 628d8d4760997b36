"""The compaction shipped to a cluster as users ship it: `spark-submit --py-files
keyfill-*.whl jobs/compact.py` on `local-cluster[2,1,1024]`, two executor JVMs with Python
workers of their own apart from the driver, sharing only storage with it.

keyfill is installed in the test environment (editable), so the driver and the workers run a
Python that does not read this environment's .pth files (`-S`): they find pyspark, numba and
the other dependencies in site-packages, and keyfill only in the shipped wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

import pytest

from compactor.sources import open_source
from compactor.verify import verify
from keyfill.cli import jobs
from keyfill.synth.generate import GeneratorConfig, generate
from keygroups import compacted
from keygroups.storage import open_storage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), ROOT],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (found,) = [f for f in os.listdir(out) if f.startswith("keyfill-") and f.endswith(".whl")]
    return str(out / found)


def python_without_keyfill(folder) -> str:
    """This interpreter, with site-packages on its path but no .pth file read, so the
    editable install of keyfill is invisible."""
    path = folder / "python"
    path.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{sysconfig.get_paths()["purelib"]}" '
        f'exec {sys.executable} -S "$@"\n'
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


def test_spark_submit_with_the_wheel_compacts_on_separate_executors(wheel, tmp_path):
    src, dest = str(tmp_path / "src"), str(tmp_path / "compacted")
    generate(
        GeneratorConfig(out=src, records=12_000, keys=200, partitions=3, chunk_records=2_000, seed=5), progress=False
    )
    python = python_without_keyfill(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME")}
    env |= {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
    done = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "spark-submit"),
            "--master",
            "local-cluster[2,1,1024]",
            "--conf",
            "spark.log.level=WARN",
            "--py-files",
            wheel,
            jobs.path("compact"),  # what `keyfill jobs compact` prints
            src,
            dest,
            "--groups",
            "4",
            "--seal-all",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the checkout: keyfill must come from the wheel
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.lstrip().startswith("{")  # --json: the result alone on stdout, logs on stderr
    manifest = compacted.load_manifest(open_storage(dest))
    assert manifest.totals["records"] == 12_000 and manifest.groups == 4
    report = verify(open_source(src), open_storage(dest))
    assert report.ok, report.violations
