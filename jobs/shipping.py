"""Make the keyfill that the driver runs importable in the executors' Python workers.

`spark-submit --py-files keyfill-*.whl` puts the wheel on the driver's sys.path, and ships
the file to every executor, but PySpark adds only names ending in .zip, .egg or .jar to the
workers' sys.path (`SparkContext.addPyFile`): a wheel arrives and is never imported, and the
first task fails with "No module named 'compactor'". A wheel is a zip, so the driver ships a
copy of it named .zip, which the workers do import. Nothing happens when keyfill is installed
(site-packages on every node, or a packed environment).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import keygroups

_ARCHIVE = re.compile(r"^(.+?\.whl)[/\\]")


def shipped_wheel() -> str | None:
    """The wheel keyfill was imported from, if it was imported from one."""
    found = _ARCHIVE.match(keygroups.__file__ or "")
    return found.group(1) if found and os.path.isfile(found.group(1)) else None


_shipped: dict[str, str] = {}  # application id -> its copy: Spark refuses a second file of one name


def ship_to_executors(spark) -> str | None:
    """If keyfill runs from a wheel, add a .zip copy of it to the job's Python files, once
    per application (a driver program may run keyfill's jobs one after another); the copy's
    path (None: nothing to do)."""
    wheel = shipped_wheel()
    if wheel is None:
        return None
    app = spark.sparkContext.applicationId
    if app not in _shipped:
        name = os.path.basename(wheel)[: -len(".whl")] + ".zip"
        copy = os.path.join(tempfile.mkdtemp(prefix="keyfill-ship-"), name)
        shutil.copyfile(wheel, copy)
        spark.sparkContext.addPyFile(copy)
        _shipped[app] = copy
    return _shipped[app]
