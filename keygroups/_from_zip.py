"""keyfill imported from a zip (`spark-submit --py-files keyfill-*.whl`): load its modules
from files extracted once per machine instead, so numba can cache the compiled kernels.

numba caches a function only when its source is a real file; from a zip every Python worker
process compiles the ~50 kernels it uses anew on first call, a long wait in every worker
(docs/performance.md#kernels-from-files-not-from-a-zip). Each top-level package's `__init__`
calls `files_for` and points its `__path__` at the extracted copy: its submodules, the
kernels among them, then load from files. The copy is named by a digest of the archive's
entries (names, CRCs, sizes), so every worker, executor and job on a machine that runs the
same wheel shares one copy and one numba cache; it is written to a temporary folder and
renamed into place, so concurrent workers never see half a copy.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import time
import zipfile

_ARCHIVE = re.compile(r"^(.+?\.(?:zip|whl|egg))[/\\]", re.IGNORECASE)


def user_cache_dir(name: str) -> str | None:
    """A writable folder for keyfill's `name` cache: under $XDG_CACHE_HOME (or ~/.cache),
    else the temp dir; None if neither can be made."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for candidate in (os.path.join(base, "keyfill", name), os.path.join(tempfile.gettempdir(), f"keyfill-{name}")):
        try:
            os.makedirs(candidate, exist_ok=True)
        except OSError:
            continue
        if os.access(candidate, os.W_OK):
            return candidate
    return None


def _root() -> str:
    found = user_cache_dir("code")
    if found is None:
        raise OSError("no writable folder for keyfill's extracted code")
    return found


def _extract(archive: str) -> str:
    with zipfile.ZipFile(archive) as z:
        entries = [i for i in z.infolist() if not i.is_dir()]
        digest = hashlib.sha256(repr([(i.filename, i.CRC, i.file_size) for i in entries]).encode()).hexdigest()[:16]
        target = os.path.join(_root(), digest)
        if os.path.isdir(target):
            return target
        scratch = tempfile.mkdtemp(prefix=f".{digest}-", dir=os.path.dirname(target))
        for info in entries:
            path = z.extract(info, scratch)
            stamp = time.mktime((*info.date_time, 0, 0, -1))  # the entry's time: stable across copies
            os.utime(path, (stamp, stamp))
    try:
        os.rename(scratch, target)
    except OSError:  # another process renamed its copy first: use that one
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def files_for(package: str, path: list[str], init_file: str | None) -> list[str]:
    """The package's `__path__`: unchanged when it was imported from files, else the
    extracted copy's folder of the package (unchanged, too, if extracting fails)."""
    if init_file is None or os.path.isfile(init_file):
        return path
    found = _ARCHIVE.match(init_file)
    if not found or not os.path.isfile(found.group(1)):
        return path
    try:
        folder = os.path.join(_extract(found.group(1)), *package.split("."))
    except (OSError, zipfile.BadZipFile):
        return path  # compile per process, as without this module
    return [folder] if os.path.isdir(folder) else path
