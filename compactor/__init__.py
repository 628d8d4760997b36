"""keyfill compactor."""

from keygroups._from_zip import files_for

__path__ = files_for(__name__, __path__, __file__)  # noqa: F821 - from a zip: the extracted copy (numba caches)
