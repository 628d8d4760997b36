"""How much a micro-batch of the Spark source may take: from Spark's read limit
(`of_read_limit`), the one Spark hands `latestOffset(start, limit)` where it has admission
control (4.2 and later: the default limit from `default_read_limit`, or all available), and
before 4.2, where Spark hands none, the same default limit the source makes itself (with
`reader.spark.api`'s stand-ins of the limit classes).

`maxSlicesPerTrigger` becomes Spark's ReadMaxFiles (a slice counts as a file), else
`maxOffsetsPerTrigger` ReadMaxRows, else `maxBytesPerTrigger` (by default
DEFAULT_MAX_BYTES_PER_TRIGGER) ReadMaxBytes; whatever else is set applies too. A paced
source (`maxEventTimePerTrigger`) takes a stride a batch whatever the limit (reader.strides),
and `maxOffsetsPerTrigger` caps its live phase."""

from __future__ import annotations

from dataclasses import dataclass, replace

from reader.spark.api import ReadAllAvailable, ReadLimit, ReadMaxBytes, ReadMaxFiles, ReadMaxRows
from reader.spark.enumerator import Limits
from reader.spark.options import DEFAULT_MAX_BYTES_PER_TRIGGER, Options


@dataclass(frozen=True)
class Admission:
    """What a micro-batch may take: of the archive, and of the live topic (records in all;
    None: every one there is)."""

    archive: Limits
    live_rows: int | None = None


def default_read_limit(o: Options) -> ReadLimit:
    """The read limit Spark 4.2 and later asks for (`getDefaultReadLimit`), and the one the
    source applies itself before 4.2."""
    if o.max_event_time_per_trigger:
        return ReadAllAvailable()
    if o.max_slices_per_trigger:
        return ReadMaxFiles(o.max_slices_per_trigger)
    if o.max_offsets_per_trigger and not o.max_bytes_per_trigger:
        return ReadMaxRows(o.max_offsets_per_trigger)
    return ReadMaxBytes(o.max_bytes_per_trigger or DEFAULT_MAX_BYTES_PER_TRIGGER)


def of_read_limit(o: Options, limit: ReadLimit) -> Admission:
    """A batch's limits under Spark's read limit: the one Spark gives (the default one, or
    all available for Trigger.Once) over the options' others."""
    archive = Limits()
    if not isinstance(limit, ReadAllAvailable):
        archive = Limits(o.max_slices_per_trigger, o.max_bytes_per_trigger, o.max_offsets_per_trigger)
    if isinstance(limit, ReadMaxFiles):
        archive = replace(archive, slices=limit.max_files)
    elif isinstance(limit, ReadMaxBytes):
        archive = replace(archive, bytes=limit.max_bytes)
    elif isinstance(limit, ReadMaxRows):
        archive = replace(archive, rows=limit.max_rows)
    live = None
    if isinstance(limit, ReadMaxRows):
        live = limit.max_rows
    elif o.max_event_time_per_trigger or not isinstance(limit, ReadAllAvailable):
        live = o.max_offsets_per_trigger
    return Admission(archive, live)
