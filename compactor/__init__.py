"""The compaction: a source archive made into a compacted one (docs/compacted-archive.md).
A statistics pass over the source, the keys packed into groups, the records rewritten into
segment files, and a version committed, on Spark (classic or Connect) or in this process:
`compactor.job.compact`, which `keyfill compact` and jobs/compact.py call."""

from keygroups._from_zip import files_for

__path__ = files_for(__name__, __path__, __file__)  # noqa: F821 - from a zip: the extracted copy (numba caches)
