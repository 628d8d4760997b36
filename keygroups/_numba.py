"""numba's `njit`, with an on-disk cache that works even when site-packages is read-only.

numba caches compiled functions next to their source; in a root-owned install or a Spark
worker that directory is not writable and every process would recompile (seconds per
function). Point NUMBA_CACHE_DIR at a user cache folder before numba is imported. Then
install the kernels the wheel ships precompiled, where they fit (`keygroups._numba_seed`).
"""

from __future__ import annotations

import os
from pathlib import Path

from keygroups import _numba_seed


def _ensure_cache_dir() -> None:
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    if os.access(Path(__file__).parent, os.W_OK):
        return
    from keygroups._from_zip import user_cache_dir

    found = user_cache_dir("numba")
    if found is not None:
        os.environ["NUMBA_CACHE_DIR"] = found


_ensure_cache_dir()
_seed = _numba_seed.usable_seed()
_generic = _numba_seed.prefer_generic(_seed)  # before numba starts compiling

import numba  # noqa: E402  (must follow the cache-dir and CPU setup)

if os.environ.get("NUMBA_CACHE_DIR") and numba.config.CACHE_DIR != os.environ["NUMBA_CACHE_DIR"]:
    numba.config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]  # numba was imported before us
if _generic:
    _numba_seed.install(_seed)  # before the first kernel looks for its cache

# Imported from a zip that keygroups._from_zip could not extract: numba finds a cache only for
# functions whose source is a real file, and `cache=True` then fails at import ("no locator
# available"). There each process compiles once instead (seconds, on first use); install
# the wheel on the executors (pip, a packed environment, an image) to keep the cache.
FROM_ZIP = not os.path.isfile(__file__)


def njit(*args, **kwargs):
    """numba.njit, without `cache` when keyfill runs from a zip."""
    if FROM_ZIP:
        kwargs.pop("cache", None)
    return numba.njit(*args, **kwargs)


__all__ = ["njit"]
