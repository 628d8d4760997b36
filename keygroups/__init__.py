"""The key-group model: packing keys into volume-balanced groups, the archive formats and
the storage layer that every other keyfill package builds on.

Packing pulls in numba; it is imported on first use so that `import keygroups` stays cheap
for Spark workers that only need storage.
"""

from typing import Any

from keygroups._from_zip import files_for

__path__ = files_for(__name__, __path__, __file__)  # noqa: F821 - from a zip: the extracted copy (numba caches)


_PACKING = ("pack", "place", "group_loads", "assign_threads")


def __getattr__(name: str) -> Any:
    if name in _PACKING:
        from keygroups import packing

        return getattr(packing, name)
    raise AttributeError(f"module 'keygroups' has no attribute {name!r}")


__all__ = list(_PACKING)
