"""Where the compacted archive goes: what is refused before any work, and what is removed
(only the replaced archive's own files, only after the new input has been read)."""

from __future__ import annotations

import logging

from compactor.sources import SourceArchive
from keygroups import compacted
from keygroups.assignment import load_assignment
from keygroups.storage import Storage, StorageError, overlapping

log = logging.getLogger("keyfill.compact")


def check_destination(source: SourceArchive, dest: Storage, overwrite: bool) -> None:
    """Refuse what would destroy data, before any work: an archive without --overwrite, a
    destination holding foreign files, or a destination and source inside one another
    (clearing one would delete the other, and the source's listing would find the archive)."""
    if overlapping(source.store, dest):
        raise StorageError(
            f"source {source.url} and destination {dest.url} overlap (one lies inside the other); "
            "write the compacted archive to a location outside the source"
        )
    existing = dest.list()
    if not existing:
        return
    if dest.exists(compacted.MANIFEST):
        if not overwrite:
            raise StorageError(f"{dest.url}: a compacted archive exists here; pass --overwrite to replace it")
        return
    foreign = [o.key for o in existing if not compacted.is_archive_key(o.key)]
    if not foreign and any(o.key == compacted.ASSIGNMENT for o in existing) and not _is_assignment(dest):
        foreign = [compacted.ASSIGNMENT]  # a file of that name, but not one keyfill wrote
    if foreign:
        raise StorageError(
            f"{dest.url}: destination holds files that are not a keyfill archive "
            f"(e.g. {dest.url_for(foreign[0])}); choose an empty location"
        )


def _is_assignment(dest: Storage) -> bool:
    """Whether assignment.parquet is a key assignment keyfill wrote (a failed run's)."""
    try:
        load_assignment(dest)
    except Exception:  # not Parquet, other columns, unreadable: in any case not ours
        return False
    return True


def clear_destination(dest: Storage) -> None:
    """Remove the archive being replaced (or what a failed run left): the manifest first, so
    it is invisible at once, then every other object of the archive layout. Files that
    keyfill did not write are left where they are."""
    owned = [o.key for o in dest.list() if compacted.is_archive_key(o.key)]
    if not owned:
        return
    log.info("removing %d files of the previous archive at %s", len(owned), dest.url)
    dest.delete(compacted.MANIFEST)
    dest.delete_many([k for k in owned if k != compacted.MANIFEST])
    kept = [o.key for o in dest.list() if not compacted.is_archive_key(o.key)]
    if kept:
        log.warning(
            "left %d files that keyfill did not write in %s (e.g. %s)", len(kept), dest.url, dest.url_for(kept[0])
        )
