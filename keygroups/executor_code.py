"""keyfill's code in the executors' Python workers, on both kinds of Spark session.

Classic (`spark-submit --py-files keyfill-*.whl`): spark-submit puts the wheel on the
driver's sys.path and ships the file to every executor, but PySpark adds only names ending
in .zip, .egg or .jar to the workers' sys.path (`SparkContext.addPyFile`): a wheel arrives
and is never imported, and the first task fails with "No module named 'compactor'". A wheel
is a zip, so the driver ships a copy of it named .zip, which the workers do import. Nothing
happens when keyfill is installed (site-packages on every node, or a packed environment).

Spark Connect (Databricks serverless and shared clusters, any `sc://` server): the client
cannot know what the server's Python holds, so one small job looks, without importing
anything of keyfill's: when the executors lack keyfill, or hold another version of it, this
installation's packages go to the session as a Python artifact (`addArtifacts(...,
pyfile=True)`: the server puts it ahead of site-packages in the session's workers). The
packages keyfill needs from PyPI cannot be shipped that way (compiled code for the server's
platform): when the executors lack one, the error names it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
import zipfile
from typing import Any

from keygroups.errors import ExecutorsNotEquipped
from keygroups.spark_kind import is_connect, to_arrow

PACKAGES = ("keyfill", "keygroups", "compactor", "reader", "jobs")  # what a task may import of keyfill
# What keyfill's tasks import from PyPI, by module name (the storage SDKs depend on the URL:
# a task that lacks one names it when it opens the store).
NEEDED = ("numpy", "pyarrow", "fastavro", "numba", "cramjam", "google_crc32c", "zlib_ng", "zstandard")

_ARCHIVE = re.compile(r"^(.+?\.whl)[/\\]")
_shipped: dict[str, str | None] = {}  # an application's or a Connect session's id -> what it was given


def shipped_wheel() -> str | None:
    """The wheel keyfill was imported from, if it was imported from one."""
    import keygroups

    found = _ARCHIVE.match(keygroups.__file__ or "")
    return found.group(1) if found and os.path.isfile(found.group(1)) else None


def ship_to_executors(spark: Any) -> str | None:
    """Make keyfill importable in the session's Python workers, once per application (a
    classic driver program may run keyfill's jobs one after another) or Connect session; the
    file shipped, if one was (None: the executors have it already)."""
    key = str(spark.session_id) if is_connect(spark) else str(spark.sparkContext.applicationId)
    if key not in _shipped:
        _shipped[key] = _ship_over_connect(spark) if is_connect(spark) else _ship_wheel(spark)
    return _shipped[key]


def _ship_wheel(spark: Any) -> str | None:
    wheel = shipped_wheel()
    if wheel is None:
        return None
    copy = _zip_named(wheel)
    spark.sparkContext.addPyFile(copy)
    return copy


def _ship_over_connect(spark: Any) -> str | None:
    found = look_on_executors(spark)
    missing = [m for m in NEEDED if m in found["missing"]]
    if missing:
        raise ExecutorsNotEquipped(
            f"the Spark cluster's Python lacks {', '.join(missing)}, which keyfill's tasks import: install "
            "keyfill there (the cluster's or the job's environment, e.g. a Databricks environment or cluster "
            "library `keyfill`; docs/deploy.md), since compiled packages cannot be shipped from this client"
        )
    lacks = {"keygroups", "compactor", "reader"} & set(found["missing"])
    if not lacks and found["version"] == _version():
        return None  # installed there, this version: nothing to ship
    wheel = shipped_wheel()
    copy = _zip_named(wheel) if wheel else _zip_of_packages()
    spark.addArtifacts(copy, pyfile=True)
    return copy


def look_on_executors(spark: Any) -> dict[str, Any]:
    """What an executor's Python finds, by one task that imports nothing of keyfill's: the
    modules of PACKAGES and NEEDED it lacks (`missing`), and keyfill's installed version
    (`version`, "" if none)."""
    import pyarrow as pa

    wanted = PACKAGES + NEEDED

    def look(batches: Any) -> Any:  # nested: pickled by value, so it runs where keyfill is absent
        import importlib.metadata as metadata
        import importlib.util as util

        for _ in batches:
            pass
        missing = [m for m in wanted if util.find_spec(m) is None]
        try:
            version = metadata.version("keyfill")
        except metadata.PackageNotFoundError:
            version = ""
        yield pa.RecordBatch.from_pydict({"missing": [",".join(missing)], "version": [version]})

    row = to_arrow(spark.range(0, 1, 1, 1).mapInArrow(look, "missing string, version string")).to_pylist()[0]
    return {"missing": [m for m in row["missing"].split(",") if m], "version": row["version"]}


def _version() -> str:
    import importlib.metadata  # here, not at the top: 25 ms of every Spark source query's start

    try:
        return importlib.metadata.version("keyfill")
    except importlib.metadata.PackageNotFoundError:
        return ""


def _zip_named(wheel: str) -> str:
    """A copy of the wheel named .zip (what PySpark puts on a worker's path)."""
    name = os.path.basename(wheel)[: -len(".whl")] + ".zip"
    copy = os.path.join(tempfile.mkdtemp(prefix="keyfill-ship-"), name)
    shutil.copyfile(wheel, copy)
    return copy


def _zip_of_packages() -> str:
    """keyfill's packages as this process imports them, in one zip (no bytecode: the
    server's Python may be another version)."""
    copy = os.path.join(tempfile.mkdtemp(prefix="keyfill-ship-"), f"keyfill-{_version() or 'local'}.zip")
    with zipfile.ZipFile(copy, "w", zipfile.ZIP_DEFLATED) as z:
        for package in PACKAGES:
            spec = importlib.util.find_spec(package)
            if spec is None or not spec.submodule_search_locations:
                continue
            root = list(spec.submodule_search_locations)[0]
            for folder, dirs, files in os.walk(root):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                for name in sorted(files):
                    if name.endswith((".pyc", ".pyo")):
                        continue
                    path = os.path.join(folder, name)
                    z.write(path, os.path.join(package, os.path.relpath(path, root)))
    return copy
