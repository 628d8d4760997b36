"""A compaction run's lease: how a run that has not committed yet tells `keyfill vacuum` that
its files are in use.

A run writes its files long before its version object names them (a real rewrite takes
hours), so vacuum cannot tell a live run's files from a dead run's by their age. Before it
writes anything, a run creates `_runs/<run>.json` (create-only: this also proves, before
any Spark job, that the destination is reachable, writable and the credentials work) and
rewrites it every `RENEW_EVERY` of the lease's duration from a daemon thread. Vacuum
deletes the files of a run that never committed only once its lease has ended: marked
`failed` by the run itself, or not renewed for `LEASE_MS` plus another `LEASE_MS` of grace
(the run's and vacuum's clocks may differ by less than that).

The other half is on the run's side: a run whose lease went unrenewed for `LEASE_MS` (the
process froze, or storage refused every renewal) may have had its files deleted, so it
never commits (`LeaseLost`), and every commit checks that the files its version names
exist (`compactor.commit.check_named`). Delta Lake and Iceberg judge orphan files by age
alone (`RETAIN`, `older_than`), and a writer slower than the window loses its files there:
this protocol does not depend on how long a run takes.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from compactor.errors import LeaseLost, RunInProgress
from keygroups import compacted
from keygroups.errors import KeyfillError, StorageError
from keygroups.storage import Storage

log = logging.getLogger("keyfill.compact")

LEASE_MS = 10 * 60_000  # a lease not renewed for this long has ended
RENEW_EVERY = 0.25  # of LEASE_MS: three renewals may fail before the lease ends
GRACE_MS = LEASE_MS  # vacuum waits this much longer: clock skew between the run and vacuum
# How long a run waits to record its end (the lease marked failed or deleted, a task's error
# object): a store that does not answer would otherwise hold the run for its whole bound
# (KEYFILL_STORAGE_DEADLINE) again after the error that ended it.
RECORD_S = 5.0
# How long a run that sees a live run ordered after it waits for that one to stop (it lists
# the leases, sees this one's and marks its own failed: about a second, or RECORD_S when the
# store is slow), and how often it looks meanwhile (`check_alone`).
LATER_WAIT_S = 15.0
LATER_POLL_S = 0.25
_pause = time.sleep  # check_alone's wait (a test counts them)
# The runs of this process that have ended, whatever their lease says: a rerun in the same
# process (a driver that retries, a test) must not wait for a lease it could not mark failed.
_ENDED: set[str] = set()
_ENDED_LOCK = threading.Lock()


def best_effort(action: Callable[[], object], seconds: float | None = None) -> str | None:
    """`action()`, a write of the run's own records, on a daemon thread waited for at most
    `seconds` (`RECORD_S`): None once it is done, else why not (its error, or no answer in
    time: it may still land later). Never raises: recording an error must not replace it."""
    seconds = RECORD_S if seconds is None else seconds
    failed: list[str] = []

    def work() -> None:
        try:
            action()
        except Exception as exc:
            failed.append(str(exc) if isinstance(exc, KeyfillError) else f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=work, name="keyfill-record", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        return f"no answer within {seconds:g} s"
    return failed[0] if failed else None


@dataclass
class LeaseRecord:
    """What `_runs/<run>.json` holds."""

    run: str
    kind: str  # compact | append
    host: str
    pid: int
    started_ms: int
    renewed_ms: int
    expires_ms: int  # renewed_ms + LEASE_MS, by the run's clock
    state: str = "running"  # running | failed (ended: vacuum may take its files at once)
    groups: int | None = None  # once known: segment files of higher groups are not the run's
    alone: bool = False  # it looked and found no run it must give way to: it goes on (`check_alone`)

    def has_ended(self, now_ms: int) -> bool:
        """Whether vacuum may take the run's files (if no version names the run)."""
        return self.state != "running" or now_ms > self.expires_ms + GRACE_MS

    @classmethod
    def parse(cls, data: bytes) -> LeaseRecord | None:
        """The lease, or None for bytes that are not one (not ours: vacuum leaves the run alone)."""
        try:
            d = json.loads(data)
            rec = cls(**d)
        except (ValueError, TypeError):
            return None
        numbers = (rec.pid, rec.started_ms, rec.renewed_ms, rec.expires_ms)
        if not all(type(v) is int for v in numbers) or not isinstance(rec.run, str):
            return None
        return rec


def read_leases(store: Storage) -> dict[str, LeaseRecord]:
    """Every run's lease by run id (unreadable ones left out: their runs are never vacuumed)."""
    out = {}
    for o in store.list(compacted.RUNS + "/"):
        run = compacted.run_of_lease(o.key)
        if run is None:
            continue
        try:
            rec = LeaseRecord.parse(store.read(o.key))
        except StorageError:
            continue  # deleted meanwhile (its run committed)
        if rec is not None and rec.run == run:
            out[run] = rec
    return out


def check_alone(store: Storage, mine: LeaseRecord, now_ms: int | None = None, wait_s: float | None = None) -> None:
    """Refuse to go on beside a live run (its lease renewed in time and not marked failed):
    only one of two runs can commit the next version, and the other would find out after
    all its work. Each run creates its lease, then looks, and (started_ms, run), the same
    to both, orders them:
    - a live run ordered first: this one stops at once;
    - a live run ordered after this one: it looked before this run's lease was there (its
      create came first though its stamp is later: a slow request) and went on, or it saw
      this lease and stops. This one stops at once if that run's lease says it went on
      (`alone`, written once it has looked), else waits for it to stop (`wait_s`,
      LATER_WAIT_S) and stops if it has not. Without this, both went on.
    A run whose lease has lapsed, or whose process on this host has exited (killed, or it
    failed against a store that no longer answered, so its lease could not be marked),
    stops no one."""

    def order(r: LeaseRecord) -> tuple[int, str]:
        return r.started_ms, r.run

    until = time.monotonic() + (LATER_WAIT_S if wait_s is None else wait_s)
    while True:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        live = [
            r
            for r in read_leases(store).values()
            if r.run != mine.run and r.state == "running" and now <= r.expires_ms and not _gone(r)
        ]
        first = min(live, key=order, default=None)
        if first is None:
            return
        if order(first) < order(mine):
            break
        went_on = [r for r in live if r.alone]  # a later one that said it goes on: no need to wait
        if went_on or time.monotonic() >= until:
            first = min(went_on or live, key=order)
            break
        _pause(LATER_POLL_S)
    at = datetime.fromtimestamp(first.started_ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    ends = datetime.fromtimestamp(first.expires_ms / 1000, timezone.utc).strftime("%H:%M:%S UTC")
    what = "append" if first.kind == "append" else "compaction"
    raise RunInProgress(
        f"{store.url}: another {what} is writing here (run {first.run}, {first.host} pid {first.pid}, since {at}), "
        "and only one run can commit the next version; this run stopped before writing any file of the archive. "
        "When it has committed (keyfill versions), run this one with --append to add the "
        f"source's new records, or --overwrite to replace it. If that run is gone, its lease "
        f"{store.url_for(compacted.lease_key(first.run))} lapses at {ends} unless it is renewed"
    )


def _gone(r: LeaseRecord) -> bool:
    """Whether the run's process has exited, when it ran on this host (elsewhere: unknown,
    so not gone), or the run ended in this process (`Lease.release`) though its lease still
    says running: a store that refused every request could not take the mark. A pid since
    reused by another process counts as alive: the safe side."""
    if r.host != socket.gethostname():
        return False
    if r.pid == os.getpid():
        with _ENDED_LOCK:
            return r.run in _ENDED
    try:
        os.kill(r.pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except OSError:
        return False  # exists, another user's
    return False


class Lease:
    """Held by a running compaction from before its first write until it commits or fails."""

    def __init__(self, store: Storage, run: str, kind: str, duration_ms: int = LEASE_MS) -> None:
        self.store, self.key, self.duration_ms = store, compacted.lease_key(run), duration_ms
        now = int(time.time() * 1000)
        self.record = LeaseRecord(run, kind, socket.gethostname(), os.getpid(), now, now, now + duration_ms)
        self._renewed = time.monotonic()  # of the last renewal that reached storage
        self._lost = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def acquire(self) -> Lease:
        """Create the lease (before the run writes anything) and start renewing it."""
        with _ENDED_LOCK:
            _ENDED.discard(self.record.run)  # a run id used again in this process (tests) runs again
        self.store.create(self.key, self._body())
        self._renewed = time.monotonic()
        self._thread = threading.Thread(target=self._renew_loop, name=f"keyfill-lease-{self.record.run}", daemon=True)
        self._thread.start()
        return self

    def went_on(self) -> None:
        """The run looked and goes on: a run that started at once and sees this lease after
        it stops without waiting (`check_alone`)."""
        with self._lock:
            self.record.alone = True
        self.renew()

    def set_groups(self, groups: int) -> None:
        with self._lock:
            self.record.groups = groups
        self.renew()

    def _body(self) -> bytes:
        return compacted.dumps(asdict(self.record))

    def renew(self) -> None:
        with self._lock:
            if self._lost:
                return
            started = time.monotonic()
            if started - self._renewed > self.duration_ms / 1000:
                self._lost = True  # vacuum may already have judged it ended: never renew again
                return
            now = int(time.time() * 1000)
            self.record.renewed_ms, self.record.expires_ms = now, now + self.duration_ms
            try:
                self.store.write(self.key, self._body())
            except StorageError as exc:
                log.warning("could not renew the run's lease %s: %s", self.store.url_for(self.key), exc)
                return
            self._renewed = started

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.duration_ms / 1000 * RENEW_EVERY):
            self.renew()

    def check(self) -> None:
        """Raise LeaseLost unless the lease has been held without a gap (right before a commit)."""
        self.renew()
        if self._lost:
            raise LeaseLost(
                f"{self.store.url_for(self.key)}: this run's lease went unrenewed for more than "
                f"{self.duration_ms // 1000} s (the process stalled, or storage refused the renewals), so a "
                "vacuum may have deleted its files; nothing of this run is committed: run it again"
            )

    def release(self, *, failed: bool) -> None:
        """Stop renewing; after a commit the lease goes, after a failure it stays marked
        failed (vacuum may then take the run's files without waiting for it to expire).
        Best effort within `RECORD_S`: a lease left as it was ends by its age."""
        self._stop.set()
        self._lost = True  # no renewal from here on
        with _ENDED_LOCK:
            _ENDED.add(self.record.run)

        def end() -> None:
            if self._thread is not None:
                self._thread.join()  # a renewal under way (it may wait on the store)
            with self._lock:
                if failed:
                    self.record.state = "failed"
                    self.store.write(self.key, self._body())
                else:
                    self.store.delete(self.key)

        why = best_effort(end)
        if why is not None:  # vacuum will judge it by its age
            # after a failure, the error that ended the run is what the user needs to read
            (log.info if failed else log.warning)(
                "could not release the run's lease %s: %s", self.store.url_for(self.key), why
            )


def take_lease(store: Storage, run: str, kind: str) -> Lease:
    """The run's lease, held, unless a live run that started first writes here
    (`check_alone`): then the lease is left marked failed and RunInProgress raised, before
    the run writes anything else, not after its whole rewrite."""
    lease = Lease(store, run, kind).acquire()
    try:
        check_alone(store, lease.record)
    except BaseException:
        lease.release(failed=True)
        raise
    lease.went_on()
    return lease
