"""The compacted archive format, version 3: one namespace for what its modules define.

Written by the compactor, read by the reader, so it lives here, in the package both
depend on. A facade for code outside `keygroups` (the compactor, the reader, the command
line, the worked examples and users' own programs: `compacted.load_manifest(store)`);
modules of `keygroups` import from the defining module instead, so the facade sits on top
of the package and defines nothing itself. The on-disk layout is documented in docs/compacted-archive.md:

    <root>/_versions/<version:020d>.json                  one per commit, created once: the
                                                          latest makes that version visible
    <root>/assignments/<run>.parquet                      key -> group (keygroups.assignment)
    <root>/index/<first slice:010d>-<run>.slices.parquet  per slice: bounds, partition ranges
    <root>/index/<first slice:010d>-<run>.pieces.parquet  per piece: file, byte range, checksum
    <root>/groups/<group:05d>/<first slice:010d>-<run>.avro
                                                          a segment: one group, consecutive slices

The storage unit (a segment file, tens of MiB) is decoupled from the sync unit (a slice):
a group's records of one slice, a *piece*, are a span of whole Avro blocks inside a segment,
decodable from its byte range plus the file's header (`keygroups.segments` writes them,
`keygroups.piece_index` finds them).

Every file a compaction writes carries its *run* id, so runs never write over each other's
files (two racing writers, or a failed run and its re-run); only a version object makes
them visible, and a version object is never replaced (`Storage.create`). A reader that
opened version n reads only files version n names, whatever is committed after.

By concept: `keygroups.layout` (file names), `keygroups.pieces` (a piece and its checksum),
`keygroups.piece_decode` (checked decoding of a span of pieces), `keygroups.manifest`
(versions and the commit). "Run" means one thing here: a compaction or append, whose id is
in its files' names; consecutive pieces fetched together are a *span*.
"""

from typing import TYPE_CHECKING, Any

from keygroups.errors import CommitConflict, FormatError, IntegrityError  # what reading the format raises
from keygroups.layout import (
    ASSIGNMENTS,
    FORMAT,
    FORMAT_VERSION,
    GET_BYTES,
    GROUPS,
    INDEX,
    INDEX_KINDS,
    LEGACY_MANIFEST,
    RUNS,
    TRIGGER_BYTES,
    VERSIONS,
    assignment_key,
    index_key,
    is_archive_key,
    lease_key,
    new_run,
    replay_gets,
    run_error_key,
    run_of,
    run_of_lease,
    run_task_key,
    segment_first_slice,
    segment_key,
    version_key,
)
from keygroups.manifest import (
    Manifest,
    commit,
    content_id,
    dumps,
    index_run,
    legacy_refusal,
    load_manifest,
    version_numbers,
    versions,
)
from keygroups.pieces import PartitionRange, Piece, SliceMeta, crc32c, crc32c_value

if TYPE_CHECKING:
    from keygroups.piece_decode import read_piece, read_span, split_span

_DECODING = ("read_piece", "read_span", "split_span")


def __getattr__(name: str) -> Any:
    """The decoder on first use: it loads numba and its compiled kernels (~0.3 s), which a
    process that only plans reads never needs (the one Spark starts per streaming query
    to plan it reads manifests and indexes, and its start is every query's)."""
    if name not in _DECODING:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from keygroups import piece_decode

    value = getattr(piece_decode, name)
    globals()[name] = value
    return value


__all__ = [
    "ASSIGNMENTS",
    "FORMAT",
    "FORMAT_VERSION",
    "GET_BYTES",
    "GROUPS",
    "INDEX",
    "INDEX_KINDS",
    "LEGACY_MANIFEST",
    "RUNS",
    "TRIGGER_BYTES",
    "VERSIONS",
    "CommitConflict",
    "FormatError",
    "IntegrityError",
    "Manifest",
    "PartitionRange",
    "Piece",
    "SliceMeta",
    "assignment_key",
    "commit",
    "content_id",
    "crc32c",
    "crc32c_value",
    "dumps",
    "index_key",
    "index_run",
    "is_archive_key",
    "lease_key",
    "legacy_refusal",
    "load_manifest",
    "new_run",
    "read_piece",
    "read_span",
    "replay_gets",
    "run_error_key",
    "run_task_key",
    "run_of",
    "run_of_lease",
    "segment_first_slice",
    "segment_key",
    "split_span",
    "version_key",
    "version_numbers",
    "versions",
]
