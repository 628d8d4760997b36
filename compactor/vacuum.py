"""Housekeeping: delete the files no retained version of a compacted archive names.

Commits never delete (docs/compacted-archive.md "Commit and failure"), so replaced versions
and failed runs leave files behind. A version is *retained* while a reader may still be
reading it: the latest always, and every version that was still the latest within the
retention window (its successor was committed less than `retain_ms` ago). A file goes when
no retained version names it and either an expired version named it or it is older than
the window (a run still writing has files no version names yet: they are young).

Which files a version names follows from its manifest alone, without reading its index:
its assignment, its index files (one pair per 4,096 slices, named by `index_runs`), and the
segment files of the runs it reads (`runs`; every segment file carries its run's id) but
for the tails that it or an earlier version stopped reading (`dropped`: an append continued
them in a file of its own).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from keygroups import compacted, piece_index
from keygroups.storage import Storage

_RUN_OF_SEGMENT = re.compile(rf"{compacted.GROUPS}/[0-9]+/[0-9]{{10}}-([0-9a-f]{{16}})\.avro")


@dataclass
class VacuumPlan:
    retained: list[int]  # versions kept
    expired: list[int]  # versions whose objects go
    files: list[str] = field(default_factory=list)  # keys to delete, version objects first
    bytes: int = 0
    kept_young: int = 0  # unnamed files left because they are younger than the window


def named_files(m: compacted.Manifest) -> tuple[set[str], set[str]]:
    """(keys, segment runs) a version reads: its version object, assignment and index files
    by key, its segment files by run."""
    keys = {compacted.version_key(m.version), m.assignment}
    for start in range(0, m.slices, piece_index.SLICES_PER_FILE):
        run = compacted.index_run(m.index_runs, start)
        keys |= {piece_index.index_key(kind, start, run) for kind in ("slices", "pieces")}
    return keys, set(m.runs)


def _named_by(ms: list[compacted.Manifest]) -> tuple[set[str], set[str]]:
    keys: set[str] = set()
    runs: set[str] = set()
    for m in ms:
        k, r = named_files(m)
        keys |= k
        runs |= r
    return keys, runs


def plan_vacuum(store: Storage, retain_ms: int, now_ms: int | None = None) -> VacuumPlan:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    committed = compacted.versions(store)
    if not committed:
        compacted.load_manifest(store)  # raises, naming what is there instead
    manifests = {v: compacted.load_manifest(store, v) for v in committed}
    # A version stays while it was the latest at some time within the window.
    successor = dict(zip(committed, committed[1:]))
    retained = [v for v in committed if v not in successor or manifests[successor[v]].created_ms > now_ms - retain_ms]
    expired = [v for v in committed if v not in retained]
    keep_keys, keep_runs = _named_by([manifests[v] for v in retained])
    old_keys, old_runs = _named_by([manifests[v] for v in expired])
    # A tail dropped by version d is read by the versions before d only (appends never take
    # a file back): it stays while one of those is retained.
    oldest = min(retained)
    gone = {k for v in committed if v <= oldest for k in manifests[v].dropped}
    plan = VacuumPlan(retained, expired)
    doomed_versions, doomed = [], []
    for o in store.list():
        if not compacted.is_archive_key(o.key) or o.key in keep_keys:
            continue
        segment = _RUN_OF_SEGMENT.fullmatch(o.key)
        run = segment[1] if segment else None
        if run in keep_runs and o.key not in gone:
            continue
        named_before = o.key in old_keys or run in old_runs or o.key in gone
        if not named_before and o.modified_ms > now_ms - retain_ms:
            plan.kept_young += 1
            continue
        (doomed_versions if o.key.startswith(compacted.VERSIONS + "/") else doomed).append(o.key)
        plan.bytes += o.size
    plan.files = doomed_versions + doomed  # an expired version disappears before its files do
    return plan


def vacuum(store: Storage, plan: VacuumPlan) -> int:
    """Delete what the plan lists (version objects first); returns how many."""
    versions = [k for k in plan.files if k.startswith(compacted.VERSIONS + "/")]
    store.delete_many(versions)
    store.delete_many(plan.files[len(versions) :])  # the plan lists version objects first
    return len(plan.files)
