"""A Python for Spark's workers that imports pyspark byte-compiled (`keyfill worker-python`).

Spark puts its `pyspark.zip` and py4j zip first on every Python worker's PYTHONPATH, and a
zip holds no bytecode and never gets any (zipimport writes none; PYTHONPYCACHEPREFIX does
not apply): each new worker compiles the pyspark modules it imports, 0.7-0.9 s of CPU for a
streaming source's worker. Spark 4.0-4.3 give that worker, and a foreachBatch worker under
Spark Connect, a fixed 10 s to connect back to the JVM (`PythonWorkerFactory`, no setting
changes it), and on a busy executor the compile alone passed it: "Python worker failed to
connect back". The launcher this module writes is an executable to give Spark as its Python
(`PYSPARK_PYTHON`, `spark.pyspark.python`): it puts in each zip's place an extracted,
byte-compiled copy of it, kept in a cache keyed by the zip's contents (its CRC and size: YARN
copies the zips into every container, so their paths differ) and the interpreter's bytecode
tag, then execs the interpreter. A zip with no copy yet is used as it is for that start
while one builder (a lock folder keeps it to one; at low priority) makes the copy; a cache
that cannot be written leaves the zips as Spark gave them. From the second start on it is as
fast as a pip-installed pyspark. The cache's default is resolved when the launcher runs, in
the home of the user Spark's workers run as.

Written by hand: neither Spark nor Python has a setting that caches bytecode for modules
imported from a zip.
"""

from __future__ import annotations

import compileall
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile

# pyspark's own tests: two thirds of the zip's files, never imported by a worker
_TESTS = re.compile(r"[/\\]tests?[/\\]")


def build(zip_path: str, target: str) -> None:
    """`target`: the zip's contents, extracted and byte-compiled, or nothing. Built under a
    temporary name and renamed in place, so a folder of that name is always complete; two
    workers building it at once both finish, one of them keeping its copy."""
    if os.path.isdir(target):
        return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    scratch = tempfile.mkdtemp(dir=os.path.dirname(target), prefix=os.path.basename(target) + ".part-")
    try:
        with zipfile.ZipFile(zip_path) as z:
            z.extractall(scratch, [n for n in z.namelist() if not _TESTS.search("/" + n)])
        compileall.compile_dir(scratch, quiet=1, workers=1)
        try:
            os.rename(scratch, target)
        except OSError:
            pass  # another worker's copy came first
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# the cache when none is given, as the launcher's shell resolves it where it runs
DEFAULT_CACHE = "${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/keyfill/pyspark"


def launcher(python: str, cache: str | None, tag: str) -> str:
    """The launcher's text: a POSIX shell script (Spark execs it as it would a Python)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where `keyfill` imports from
    builder = f"import sys; sys.path.insert(0, {here!r}); from keyfill.worker_python import build; build(*sys.argv[1:])"
    where = shlex.quote(cache) if cache else f'"{DEFAULT_CACHE}"'
    return f"""#!/bin/sh
# Written by `keyfill worker-python`: Spark's Python, with pyspark and py4j imported from an
# extracted, byte-compiled copy of Spark's zips (keyfill/worker_python.py says why).
real={shlex.quote(python)}
cache=${{KEYFILL_PYSPARK_CACHE:-{where}}}
set -f
kept=
IFS=:
for entry in $PYTHONPATH; do
    case $entry in
        */pyspark.zip | */py4j-*-src.zip)
            if [ -f "$entry" ] && sum=$(cksum <"$entry" 2>/dev/null); then
                name=${{entry##*/}}
                copy=$cache/${{name%.zip}}-${{sum%% *}}-${{sum#* }}-{tag}
                if [ ! -d "$copy" ] && [ "${{KEYFILL_PYSPARK_BUILD:-}}" = now ]; then
                    "$real" -I -c {shlex.quote(builder)} "$entry" "$copy" </dev/null >/dev/null 2>&1
                elif [ ! -d "$copy" ] && mkdir -p "$cache" 2>/dev/null && mkdir "$copy.lock" 2>/dev/null; then
                    ( nice "$real" -I -c {shlex.quote(builder)} "$entry" "$copy" </dev/null >/dev/null 2>&1
                      rmdir "$copy.lock" 2>/dev/null ) &
                fi
                [ -d "$copy" ] && entry=$copy
            fi
            ;;
    esac
    kept=${{kept:+$kept:}}$entry
done
unset IFS
PYTHONPATH=$kept
export PYTHONPATH
exec "$real" "$@"
"""


def write(path: str, python: str = sys.executable, cache: str | None = None) -> str:
    """Write the launcher at `path` (in place at once: executors may be running the one it
    replaces), readable and executable by all; the cache it names."""
    if os.sep in python:
        python = os.path.abspath(python)
    cache = os.path.abspath(cache) if cache else None
    tag = subprocess.run(
        [python, "-I", "-c", "import sys; print(sys.implementation.cache_tag)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    folder = os.path.dirname(os.path.abspath(path))
    fd, scratch = tempfile.mkstemp(dir=folder, prefix=".keyfill-python-")
    with os.fdopen(fd, "w") as f:
        f.write(launcher(python, cache, tag))
    os.chmod(scratch, 0o755)
    os.replace(scratch, path)
    return cache or DEFAULT_CACHE


def prime(path: str, zips: list[str]) -> None:
    """Build the copies of `zips` now, through the launcher at `path` (its cache key is the
    shell's `cksum`, so the launcher itself names them)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(zips), "KEYFILL_PYSPARK_BUILD": "now"}
    subprocess.run([path, "-c", "pass"], env=env, check=True, timeout=600)


def imports_from(path: str, zips: list[str]) -> str:
    """Where the launcher at `path` imports pyspark from, given Spark's `zips`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(zips)}
    found = subprocess.run(
        [path, "-c", "import pyspark; print(pyspark.__file__)"], env=env, capture_output=True, text=True, timeout=600
    )
    return found.stdout.strip()


def spark_zips() -> list[str]:
    """The zips of the pyspark this Python imports, if it has them (a pip pyspark does)."""
    try:
        import pyspark
    except ImportError:
        return []
    lib = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib")
    if not os.path.isdir(lib):
        return []
    return sorted(
        os.path.join(lib, n) for n in os.listdir(lib) if n == "pyspark.zip" or re.match(r"py4j-.*-src\.zip$", n)
    )
