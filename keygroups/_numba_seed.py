"""Kernels compiled when the wheel was built, installed into numba's cache at import, so a
fresh executor's first task loads them instead of compiling them.

On an empty cache numba compiles keyfill's kernels on first call, seconds in a fresh process
(a Spark read task, a compaction, a replay), paid by every new executor
(docs/deploy.md#a-fresh-executors-first-task-kernels-shipped-compiled). `make wheel`
(`keyfill.numba_warm`) compiles them all once and ships numba's cache files in
`keygroups/_numba_cache/` with a `seed.json` that says for which numba, Python and machine
they were built. At import, where those match, this module copies them to where numba
will look for them (`install`), and numba loads them like its own.

Why it works anywhere: numba stamps a cache entry with a hash of the source file's contents
(numba >= 0.68; older ones used its mtime, which pip does not keep, hence the exact version
check), and keys it by the CPU it was compiled for. The seed is compiled for the `generic`
CPU of the machine's architecture, so processes that use it compile for that CPU too
(`prefer_generic`, before numba is imported): about the speed of code tuned for the host
(measured: docs/deploy.md#a-fresh-executors-first-task-kernels-shipped-compiled). Where the
user has chosen a CPU (NUMBA_CPU_NAME or NUMBA_CPU_FEATURES), set KEYFILL_NUMBA_SEED=0, or
imported numba and compiled before keyfill, the seed is left alone and numba compiles as it
would without one.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

SEED_DIR = Path(__file__).resolve().parent / "_numba_cache"
MANIFEST = "seed.json"
CPU = "generic"


def python_tag() -> str:
    return f"py{sys.version_info[0]}{sys.version_info[1]}"


def target() -> dict[str, str]:
    """What a seed must have been built for to be used here (numba's version without
    importing numba: the seed decides the CPU numba starts with)."""
    try:
        version = metadata.version("numba")
    except metadata.PackageNotFoundError:
        version = ""
    return {"numba": version, "python": python_tag(), "machine": platform.machine(), "cpu": CPU}


def usable_seed() -> dict[str, Any] | None:
    """The shipped seed's manifest, if it fits this process; None otherwise."""
    if os.environ.get("KEYFILL_NUMBA_SEED", "1") == "0":
        return None
    if os.environ.get("NUMBA_CPU_NAME") or os.environ.get("NUMBA_CPU_FEATURES") is not None:
        return None  # the user chose what numba compiles for
    try:
        manifest = json.loads((SEED_DIR / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or any(manifest.get(k) != v for k, v in target().items()):
        return None
    return manifest


def prefer_generic(manifest: dict[str, Any] | None) -> bool:
    """Compile for the seed's CPU from now on; False where numba has already compiled for
    another one in this process (its codegen is made once)."""
    if manifest is None:
        return False
    numba = sys.modules.get("numba")
    if numba is not None:
        from numba.core.registry import cpu_target

        if "_toplevel_target_context" in vars(cpu_target):
            return False
    # Through the environment, not numba.config alone: numba re-reads NUMBA_* whenever the
    # environment changes, and would drop a value set only in its config.
    os.environ["NUMBA_CPU_NAME"] = CPU
    if numba is not None:
        numba.config.reload_config()
    return True


def _cache_dir_for(py_file: Path) -> Path | None:
    """The folder numba will cache `py_file`'s kernels in, found by numba's own locators (the
    user's NUMBA_CACHE_DIR, the source's __pycache__ if writable, the user-wide cache)."""
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # type: ignore[attr-defined]  # its name before numba 0.61
    for cls in impl._locator_classes:
        locator = cls.from_function(_cache_dir_for, str(py_file))
        if locator is not None:
            return Path(locator.get_cache_path())
    return None


def install(manifest: dict[str, Any]) -> int:
    """Copy the seed's files where numba looks for them; the number of folders seeded.
    A marker named by the seed's digest makes later imports cost one stat per folder.
    Files are written under a temporary name and renamed: concurrent workers that seed the
    same folder write the same bytes, and numba never reads half a file."""
    root = SEED_DIR.parent.parent  # the folder the packages are imported from
    seeded = 0
    for rel, names in manifest.get("dirs", {}).items():
        source = root / rel
        py_files = sorted(source.glob("*.py"))
        try:
            cache = _cache_dir_for(py_files[0]) if py_files else None
        except Exception:  # numba's internals moved: compile as without a seed
            return seeded
        if cache is None:
            continue
        marker = cache / f"keyfill-seed-{manifest['digest']}"
        if marker.exists():
            continue
        try:
            cache.mkdir(parents=True, exist_ok=True)
            # data files before the indexes that name them
            for name in sorted(names, key=lambda n: n.endswith(".nbi")):
                tmp = cache / f".{name}.{os.getpid()}.tmp"
                shutil.copyfile(SEED_DIR / rel / name, tmp)
                os.replace(tmp, cache / name)
            marker.touch()
            seeded += 1
        except OSError:
            continue  # unwritable or vanished: numba compiles these kernels as usual
    return seeded
