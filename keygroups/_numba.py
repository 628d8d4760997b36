"""numba's `njit`, with an on-disk cache that works even when site-packages is read-only.

numba caches compiled functions next to their source; in a root-owned install or a Spark
worker that directory is not writable and every process would recompile (seconds per
function). Point NUMBA_CACHE_DIR at a user cache folder before numba is imported. Then
install the kernels the wheel ships precompiled, where they fit (`keygroups._numba_seed`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import keygroups._numba_seed as _numba_seed  # by its own name: not through the package (its __getattr__ loads packing)


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
import numpy as np  # noqa: E402

# numba.config sets its names at import time, where mypy does not see them (attr-defined).
if os.environ.get("NUMBA_CACHE_DIR") and numba.config.CACHE_DIR != os.environ["NUMBA_CACHE_DIR"]:  # type: ignore[attr-defined]
    numba.config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]  # type: ignore[attr-defined]  # numba was imported before us
if _generic and _seed is not None:  # prefer_generic is False without a seed
    _numba_seed.install(_seed)  # before the first kernel looks for its cache

# Imported from a zip that keygroups._from_zip could not extract: numba finds a cache only for
# functions whose source is a real file, and `cache=True` then fails at import ("no locator
# available"). There each process compiles once instead (seconds, on first use); install
# the wheel on the executors (pip, a packed environment, an image) to keep the cache.
FROM_ZIP = not os.path.isfile(__file__)


_Kernel = TypeVar("_Kernel", bound=Callable[..., Any])
Int = int | np.integer[Any]  # an integer as compiled kernels see one: Python's, or a numpy scalar


def njit(*args: Any, **kwargs: Any) -> Callable[[_Kernel], _Kernel]:
    """numba.njit, without `cache` when keyfill runs from a zip.

    Typed as keeping the kernel's signature: callers use only the call (`@njit(...)`), and a
    numba dispatcher takes the same arguments as the Python function it compiles."""
    if FROM_ZIP:
        kwargs.pop("cache", None)
    decorate: Callable[[_Kernel], _Kernel] = numba.njit(*args, **kwargs)
    return decorate


__all__ = ["njit"]
