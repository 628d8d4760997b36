"""`--format delta`: a topic kept as a Delta table (docs/delta-source.md).

`source` pins the version, lists chunks and reads them; `table` opens the table with
delta-rs and the storage settings keyfill already reads.
"""

from __future__ import annotations

from compactor.sources.delta.source import DeltaOptions, DeltaSource

__all__ = ["DeltaSource", "DeltaOptions"]
