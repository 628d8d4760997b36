"""The executors' view of a run's stores, checked before its first pass when they do not run
here (a Spark Connect server's, a cluster's).

Executors open the archives with the cluster's own credentials and storage settings, not
the client's: a Connect client on a laptop or an Airflow worker may reach a bucket its
server cannot, and a local path names the server's disk, not the client's. Without this
check the first pass would fail deep in a task, after Spark's retries, with an SDK's error;
with it, one task per store reads what the passes will read and one line names the store.
"""

from __future__ import annotations

from compactor.execution import Execution, Rows
from compactor.sources import SourceArchive, SourceChunk
from keygroups import compacted
from keygroups.errors import ExecutorsNotEquipped
from keygroups.storage import Storage

WHY = (
    "Spark's executors open archives with the cluster's own credentials and storage settings (AWS_*, "
    "GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*, KEYFILL_STORAGE_*, the cluster's instance or managed "
    "identity), not this machine's, and a local path is the cluster's disk: set them on the cluster "
    "(docs/deploy.md, 'Spark Connect')"
)


def check_executors_reach(
    execution: Execution[Rows], source: SourceArchive, chunks: list[SourceChunk], dest: Storage, run: str | None
) -> None:
    """Raise ExecutorsNotEquipped when a task cannot read the source's first chunk or, for a
    run that holds a lease (`run`), does not see the lease this process wrote."""
    checks: list[tuple[str, Storage, str, bool]] = []
    if chunks:
        checks.append((f"the source archive {source.url}", source.store, chunks[0].key, True))
    if run is not None:
        checks.append((f"the destination {dest.url}", dest, compacted.lease_key(run), False))
    for (what, store, key, _), problem in zip(checks, execution.each("archive access", _look, checks)):
        if problem is not None:
            raise ExecutorsNotEquipped(f"Spark's executors cannot read {what} ({store.url_for(key)}): {problem}. {WHY}")


def _look(check: tuple[str, Storage, str, bool]) -> str | None:
    """What stops a task reading `key` (None: nothing). A source chunk is read (one byte);
    the lease must exist: an executor that does not see it sees another store."""
    _, store, key, read = check
    try:
        if read:
            store.read_range(key, 0, 1)
        elif not store.exists(key):
            return "this run's lease, written by the client a moment ago, is not there: the executors see another store"
    except Exception as exc:  # whatever the SDK raises is the answer, in one line
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return None
