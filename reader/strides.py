"""Event-time pacing of the Spark source: every micro-batch reads one *stride* of event
time, so the sources of one query (a join of topics) move through event time together.

Spark's watermark over several inputs is the minimum of theirs, so an input that runs
ahead keeps its rows in the join's state until the others catch up. Each source plans
alone (PySpark runs it in its own Python worker, with no word from the others), so what
keeps them together must follow from what they share: their options. Strides lie on a
grid of `maxEventTimePerTrigger` from the epoch; the first is the one holding
`startingTimestamp`, given alike to every source; micro-batch n then reads stride
first + n in every source, whatever its archive's size, gaps or first time. A source with
nothing in a stride still advances (its offset names the stride), so it stays in step.

A stride is a whole number of the archive's slices, so a stride's end is a slice boundary
in every archive: after micro-batch n no source has read a record whose partition's
running maximum lies past the end of stride first + n, nor left one before it. A record
then reaches the join no later, in event time, than it would have with every source
replayed in one lockstep, and invariant 3 (no new lateness) holds across the sources
(docs/spark-source.md, "Joining topics").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from keygroups import compacted
from reader.errors import DataSourceOptionError

if TYPE_CHECKING:
    from reader.spark.enumerator import ArchivePlanner


@dataclass(frozen=True)
class Strides:
    """The grid: stride k is [k * length_ms, (k + 1) * length_ms) of event time."""

    length_ms: int

    def of(self, t_ms: int) -> int:
        """The stride holding `t_ms`."""
        return t_ms // self.length_ms

    def check(self, manifest: compacted.Manifest, url: str) -> None:
        d = manifest.slice_duration_ms
        if self.length_ms % d:
            raise DataSourceOptionError(
                f"option maxEventTimePerTrigger={self.length_ms} ms: {url} is cut in slices of {d} ms, and a stride "
                "must be a whole number of slices (in every archive the query paces: a common multiple of their "
                "slice lengths)"
            )

    def latest(self, planner: ArchivePlanner, start: dict[str, Any], first: int, slices: int) -> dict[str, Any]:
        """The offset after the stride `start` names (a `reader.spark.enumerator.ArchivePlanner`'s):
        the stride's slices, or none, but the stride moves on while the archive has slices
        left to read, so every paced source stays in step. `first`: `start`'s slice; `slices`:
        where the read ends."""
        if "stride" not in start:
            raise DataSourceOptionError(
                f"option maxEventTimePerTrigger: the query's checkpoint holds offsets of an unpaced read of "
                f"{planner.store.url} (no stride); restart it with a new checkpoint location to pace it"
            )
        if first >= slices:
            return start
        self.check(planner.manifest, planner.store.url)
        k = int(start["stride"])
        end = max(first, self.end_slice(planner.manifest, k))
        return planner.offset(min(end, slices)) | {"stride": k + 1}

    def end_slice(self, manifest: compacted.Manifest, k: int) -> int:
        """The first slice of `manifest` past stride k (a position in 0..slices)."""
        first_after = (k + 1) * self.length_ms // manifest.slice_duration_ms
        return min(max(0, first_after - manifest.base), manifest.slices)
