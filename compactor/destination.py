"""Where the compacted archive goes: what is refused before any work, and what an
--overwrite leaves behind.

A compaction never deletes the archive it replaces: it writes its files beside the old
ones (every file name carries the run id) and commits a new version; readers of the old
version keep reading it, and a failed run leaves it as it was. The replaced version's
files go when `keyfill vacuum` no longer retains it. Only archives of the unversioned
formats (1 and 2) are removed, once the new version is committed.
"""

from __future__ import annotations

import logging

from compactor.sources import SourceArchive
from keygroups import compacted
from keygroups.storage import Storage, StorageError, overlapping

log = logging.getLogger("keyfill.compact")


def check_destination(source: SourceArchive, dest: Storage, overwrite: bool, append: bool = False) -> int | None:
    """Refuse what would destroy data, before any work: an archive without --overwrite, a
    destination holding foreign files, or a destination and source inside one another
    (the source's listing would find the archive, or a vacuum would delete the source).
    Returns the latest committed version, which the new one follows (and an append grows)."""
    if overlapping(source.store, dest):
        raise StorageError(
            f"source {source.url} and destination {dest.url} overlap (one lies inside the other); "
            "write the compacted archive to a location outside the source"
        )
    existing = dest.list()
    if not existing:
        return None
    committed = compacted.version_numbers(o.key for o in existing)
    if any(o.key == compacted.LEGACY_MANIFEST for o in existing):  # nothing builds on it, nor replaces it
        raise StorageError(compacted.legacy_refusal(dest))
    if committed:
        if not (overwrite or append):
            raise StorageError(
                f"{dest.url}: a compacted archive exists here; pass --append to grow it with the source's new records, "
                "or --overwrite to replace it with a new version"
            )
        return committed[-1]
    # Only a run's files (named by a run id) may be here: any other name is not ours to build on.
    foreign = [o.key for o in existing if not compacted.is_archive_key(o.key)]
    if foreign:
        raise StorageError(
            f"{dest.url}: destination holds files that are not a keyfill archive "
            f"(e.g. {dest.url_for(foreign[0])}); choose an empty location"
        )
    return None  # files of runs that never committed: invisible, left for vacuum
