"""Housekeeping: delete the files no retained version of a compacted archive names.

Commits never delete (docs/compacted-archive.md "Commit and failure"), so replaced versions
and failed runs leave files behind. A version is *retained* while a reader may still be
reading it: the latest always, and every version that was still the latest within the
retention window (its successor was committed less than `retain_ms` ago).

A file goes when no retained version names it and either

- an expired version names it: its version object, assignment and index files, and the
  tails it dropped once no earlier version is retained; or
- it is a file of a run that has *ended* and that no retained version reads: the run's
  lease (`compactor.lease`) says it failed or expired, or was not renewed for the lease's
  length plus a grace; the file is laid out as that run's (its assignment, its index
  files, its segment files of groups below its group count).

Nothing else is touched, whatever its name: files of a run whose lease is live (a
compaction or append still writing, however long it takes), and files of runs that no
version and no lease knows (written by someone else, or left by a keyfill from before
leases): those are counted and reported, never deleted.

Runs that only expired versions read get a lease marked `expired` before anything of
theirs is deleted, so a vacuum stopped part-way is finished by the next one. Which files a
version names follows from its manifest alone, without reading its index: its assignment,
its index files (one pair per 4,096 slices, named by `index_runs`), and the segment files
of the runs it reads (`runs`) but for the tails that it or an earlier version stopped
reading (`dropped`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from compactor.lease import LeaseRecord, read_leases
from keygroups import compacted, piece_index
from keygroups.storage import Storage


@dataclass
class VacuumPlan:
    retained: list[int]  # versions kept
    expired: list[int]  # versions whose objects go
    files: list[str] = field(default_factory=list)  # keys to delete: version objects first, leases last
    bytes: int = 0
    kept_live: int = 0  # files of runs whose lease is live: still writing
    kept_unknown: int = 0  # files of runs no version or lease knows: not ours to judge
    mark_expired: list[LeaseRecord] = field(default_factory=list)  # leases to write before deleting


def named_files(m: compacted.Manifest) -> tuple[set[str], set[str]]:
    """(keys, segment runs) a version reads: its version object, assignment and index files
    by key, its segment files by run."""
    keys = {compacted.version_key(m.version), m.assignment}
    for start in range(0, m.slices, piece_index.SLICES_PER_FILE):
        run = compacted.index_run(m.index_runs, start)
        keys |= {compacted.index_key(kind, start, run) for kind in compacted.INDEX_KINDS}
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
    listing = store.list()
    # Leases and versions are read after the listing: a run creates its lease before its
    # first file, so every run with a file listed has its lease (or its version) seen here.
    leases = read_leases(store)
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
    committed_runs = {r for m in manifests.values() for r in m.runs}

    plan = VacuumPlan(retained, expired)
    # Runs only expired versions read: marked expired first, so their files stay deletable
    # if this vacuum stops after their version objects are gone.
    for v in expired:
        for r in manifests[v].runs:
            if r in old_runs - keep_runs and (r not in leases or leases[r].state == "running"):
                m = manifests[v]
                marked = LeaseRecord(r, m.kind, "vacuum", 0, now_ms, now_ms, now_ms, "expired", m.groups)
                leases[r] = marked
                plan.mark_expired.append(marked)
    ended = {
        run: lease
        for run, lease in leases.items()
        if run not in keep_runs and (run not in committed_runs or run in old_runs) and lease.has_ended(now_ms)
    }
    doomed_versions, doomed, doomed_leases = [], [], []
    for o in listing:
        if not compacted.is_archive_key(o.key) or o.key in keep_keys:
            continue
        run, group = compacted.run_of(o.key) or (None, None)
        if group is not None and run in keep_runs and o.key not in gone:
            continue
        if o.key.startswith(compacted.VERSIONS + "/"):
            if o.key in old_keys:
                doomed_versions.append(o.key)
                plan.bytes += o.size
            else:
                plan.kept_unknown += 1  # a version committed after the listing
            continue
        if run is None:  # unreachable: every archive object but a version is named by its run (keygroups.layout)
            plan.kept_unknown += 1
            continue
        if compacted.run_of_lease(o.key) is not None:
            lease = leases.get(run)
            # a committed run's lease (its commit could not delete it) goes once it has ended
            if run in ended or (lease is not None and run in committed_runs and lease.has_ended(now_ms)):
                doomed_leases.append(o.key)
                plan.bytes += o.size
            elif lease is not None and not lease.has_ended(now_ms):
                plan.kept_live += 1
            else:
                plan.kept_unknown += 1
            continue
        owner = ended.get(run)
        if o.key in old_keys or o.key in gone or (owner is not None and _laid_out(owner, group)):
            doomed.append(o.key)
            plan.bytes += o.size
        elif run in leases and not leases[run].has_ended(now_ms):
            plan.kept_live += 1
        else:
            plan.kept_unknown += 1
    listed = set(doomed_leases)
    doomed_leases += [k for k in (compacted.lease_key(lease.run) for lease in plan.mark_expired) if k not in listed]
    # an expired version disappears before its files do; a lease after its run's files
    plan.files = doomed_versions + doomed + doomed_leases
    return plan


def _laid_out(lease: LeaseRecord, group: int | None) -> bool:
    """Whether a file of the lease's run is one the run could have written."""
    return group is None or lease.groups is None or group < lease.groups


def vacuum(store: Storage, plan: VacuumPlan) -> int:
    """Carry the plan out: leases of expired runs marked, then version objects, files, and
    the leases of the runs whose files are gone; returns how many objects were deleted."""
    for lease in plan.mark_expired:
        store.write(compacted.lease_key(lease.run), compacted.dumps(asdict(lease)))
    versions = [k for k in plan.files if k.startswith(compacted.VERSIONS + "/")]
    leases = [k for k in plan.files if compacted.run_of_lease(k) is not None]
    store.delete_many(versions)
    store.delete_many([k for k in plan.files[len(versions) : len(plan.files) - len(leases)]])
    store.delete_many(leases)
    return len(plan.files)
