"""The audit's record-level checks (`keyfill verify`), written once as Arrow tasks that the
execution runs in this process or in Spark tasks (`compactor.execution`).

Two steps. `read_task` reads every source chunk and checks every archive file on its own
(`compactor.verify.file`), yielding a row per record: its partition, offset, fingerprint and
a time (a source record's timestamp; an archived record's slice start), and a row per file
problem. `compare_task` then walks each partition's rows in offset order (the execution's
`scan`: source and archive merged, one batch at a time, so no task holds a partition) and
finds, record by record:

- exactly once: a source record below the hand-off the archive lacks, an archived record the
  source lacks below it, an offset archived more than once, contents that differ;
- slice bounds: a record in a slice before the one its partition's running maximum
  timestamp names (and counts those after it: made late, which the manifest must count);
- the hand-off the source implies: each partition's first record whose running-maximum slice
  is not published, or its last offset + 1.

It keeps each check's first violations (`MAX_REPORTED`, in partition, offset order) and
counts them all; `found` adds up the tasks' rows, whatever partitions each task held, so a
report is the same from one task or many."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from compactor.execution import Task
from compactor.sources import SourceArchive, SourceChunk
from compactor.verify.file import FileChecker
from keygroups import compacted, envelope
from keygroups.compacted import PartitionRange, Piece

MAX_REPORTED = 20  # violations listed per check; the count is always exact
Ints = npt.NDArray[np.int64]


class Read(IntEnum):
    """What a row of `read_task` holds (its `kind`; the order source before archive is the
    order `compare_task` sees an offset's rows in)."""

    SOURCE = 0  # a source record: partition, offset, its timestamp (`time`), its fingerprint (`fp`)
    ARCHIVED = 1  # an archived record: partition, offset, its slice's start (`time`), its fingerprint
    PROBLEM = 2  # a failed check of an archive file: its input row (`input`), `check`, `message`


READ_ROWS = pa.schema(
    [("kind", pa.int32()), ("input", pa.int32()), ("partition", pa.int32()), ("offset", pa.int64()),
     ("time", pa.int64()), ("fp", pa.int64()), ("check", pa.string()), ("message", pa.string())]
)  # fmt: skip
RECORD_COLUMNS = ("kind", "partition", "offset", "time", "fp")
SCAN_KEY, SCAN_ORDER = "partition", ("offset", "kind", "time", "fp")  # identical rows alone tie


class Found(IntEnum):
    """What a row of `compare_task` holds."""

    VIOLATION = 0  # one of a check's first violations in the task: check, partition, offset, value, message
    COUNT = 1  # a check's violations in the task (`value`)
    HANDOFF = 2  # a source partition's hand-off as the source implies it (`value`)
    TALLY = 3  # a total named by `check`: "records" archived, "made_late" records


FOUND_ROWS = pa.schema(
    [("kind", pa.int32()), ("check", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
     ("value", pa.int64()), ("message", pa.string())]
)  # fmt: skip


def inputs(chunks: int, files: int) -> pa.Table:
    """`read_task`'s input: a row per source chunk, then a row per archive file."""
    return pa.table({"input": pa.array(range(chunks + files), pa.int32())})


def read_task(
    source: SourceArchive,
    chunks: list[SourceChunk],
    checker: FileChecker,
    files: list[tuple[str, list[Piece]]],
    ranges: dict[int, list[PartitionRange]],
) -> Task:
    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for rows in batches:
            for i in rows.column("input").to_pylist():
                if i < len(chunks):
                    b = source.read(chunks[i])
                    yield _records(Read.SOURCE, b, b.column("timestamp").cast(pa.int64()))
                    continue
                key, pieces = files[i - len(chunks)]
                b, starts, problems = checker(key, pieces, ranges)
                yield _records(Read.ARCHIVED, b, pa.array(starts, pa.int64()))
                if problems:
                    yield _problems(i, problems)

    return task


def _records(kind: Read, b: pa.RecordBatch, time: pa.Array) -> pa.RecordBatch:
    n = b.num_rows
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(n, int(kind), np.int32)),
            pa.nulls(n, pa.int32()),
            b.column("partition").cast(pa.int32()),
            b.column("offset").cast(pa.int64()),
            time,
            pa.array(envelope.record_fingerprints(b).view(np.int64)),
            pa.nulls(n, pa.string()),
            pa.nulls(n, pa.string()),
        ],
        schema=READ_ROWS,
    )


def _problems(i: int, problems: list[tuple[str, str]]) -> pa.RecordBatch:
    k = len(problems)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(k, int(Read.PROBLEM), np.int32)),
            pa.array(np.full(k, i, np.int32)),
            pa.nulls(k, pa.int32()),
            pa.nulls(k, pa.int64()),
            pa.nulls(k, pa.int64()),
            pa.nulls(k, pa.int64()),
            pa.array([c for c, _ in problems], pa.string()),
            pa.array([m for _, m in problems], pa.string()),
        ],
        schema=READ_ROWS,
    )


def compare_task(manifest: compacted.Manifest) -> Task:
    """The checks along each partition's rows (`read_task`'s records, in `SCAN_ORDER`)."""
    handoff = manifest.handoff
    duration, base, slices = manifest.slice_duration_ms, manifest.base, manifest.slices

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        walk = _Walk(duration, base, slices, handoff)
        for b in batches:
            walk.add(b)
        yield walk.finish()

    return task


@dataclass
class _Walk:
    """One task's walk along its partitions' rows. The rows of the last offset of a batch
    wait for the next (they may go on there); a partition's running maximum, its first
    unpublished offset and its last offset carry over batches."""

    duration: int
    base: int
    slices: int
    handoff: dict[int, int]
    carried: list[Ints] = field(default_factory=list)  # kind, partition, offset, time, fp
    partition: int | None = None
    runmax: int | None = None
    unpublished: int | None = None
    last: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    kept: dict[str, list[tuple[int, int, int, str]]] = field(default_factory=dict)  # partition, offset, value, message
    handoffs: list[tuple[int, int]] = field(default_factory=list)
    records: int = 0
    made_late: int = 0

    def add(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        cols = [batch.column(c).to_numpy().astype(np.int64) for c in RECORD_COLUMNS]
        if self.carried:
            cols = [np.concatenate([a, b]) for a, b in zip(self.carried, cols)]
        part, off = cols[1], cols[2]
        cut = int(np.argmax((part == part[-1]) & (off == off[-1])))  # sorted: the last offset's rows
        self._rows([c[:cut] for c in cols])
        self.carried = [c[cut:] for c in cols]

    def finish(self) -> pa.RecordBatch:
        if self.carried:
            self._rows(self.carried)
        self._end_partition()
        rows: list[tuple[Found, str | None, int | None, int | None, int, str | None]] = []
        for check, found in sorted(self.kept.items()):
            rows += [(Found.VIOLATION, check, p, o, v, m) for p, o, v, m in found]
        rows += [(Found.COUNT, check, None, None, n, None) for check, n in sorted(self.counts.items())]
        rows += [(Found.HANDOFF, None, p, None, o, None) for p, o in self.handoffs]
        rows += [(Found.TALLY, "records", None, None, self.records, None)]
        rows += [(Found.TALLY, "made_late", None, None, self.made_late, None)]
        columns = list(zip(*rows))
        return pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(columns, FOUND_ROWS)], schema=FOUND_ROWS)

    def _rows(self, cols: list[Ints]) -> None:
        kind, part = cols[0], cols[1]
        bounds = [0, *(np.flatnonzero(np.diff(part)) + 1).tolist(), len(part)]
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            if hi > lo:
                p = int(part[lo])
                if p != self.partition:
                    self._end_partition()
                    self.partition = p
                source = kind[lo:hi] == Read.SOURCE
                off, time, fp = (c[lo:hi] for c in cols[2:])
                self._partition(p, (off[source], time[source], fp[source]), (off[~source], time[~source], fp[~source]))

    def _end_partition(self) -> None:
        if self.last is not None and self.partition is not None:
            self.handoffs.append((self.partition, self.last + 1 if self.unpublished is None else self.unpublished))
        self.partition = self.runmax = self.unpublished = self.last = None

    def _partition(self, p: int, source: tuple[Ints, Ints, Ints], archive: tuple[Ints, Ints, Ints]) -> None:
        """Consecutive rows of partition `p`, whole offsets: the source's (offsets, timestamps,
        fingerprints) and the archive's (offsets, slice starts, fingerprints)."""
        so, ts, sfp = source
        ao, start, afp = archive
        self.records += len(ao)
        d = self.duration
        runmax = np.maximum.accumulate(ts) if len(ts) else ts
        if self.runmax is not None:
            runmax = np.maximum(runmax, self.runmax)
        slice_of = runmax // d  # each source record's slice, its running maximum's (counted from the epoch)
        unpublished = slice_of - self.base >= self.slices
        if len(so):
            self.runmax, self.last = int(runmax[-1]), int(so[-1])
            if self.unpublished is None and unpublished.any():
                self.unpublished = int(so[np.argmax(unpublished)])
        # the source's records below the hand-off: the manifest's, or where sealing leaves off
        below = so < self.handoff[p] if p in self.handoff else ~unpublished
        so, ts, sfp, own = so[below], ts[below], sfp[below], slice_of[below] * d  # own: its slice's start
        if len(so):  # each archived record's source record, if the source has one below the hand-off
            at = np.minimum(np.searchsorted(so, ao), len(so) - 1)
            found = so[at] == ao
            differ, own_a = found & (afp != sfp[at]), own[at]
        else:
            found = differ = np.zeros(len(ao), bool)
            own_a = np.zeros(len(ao), np.int64)
        offsets, times = np.unique(ao, return_counts=True)
        self.made_late += int((found & (own_a < start)).sum())
        check = self._violations
        check("exactly_once", p, ~np.isin(so, ao), so, ts, lambda i: "in the source, not in the archive")
        check("exactly_once", p, ~found, ao, start, lambda i: "in the archive, not in the source below its hand-off")
        check("exactly_once", p, times > 1, offsets, times, lambda i: f"{times[i]} times in the archive")
        check("exactly_once", p, differ, ao, start, lambda i: "record contents differ from the source")
        check(
            "slice_bounds",
            p,
            found & (own_a > start),
            ao,
            start,
            lambda i: (
                f"in the slice starting at {start[i]}, before the slice of its running maximum timestamp ({own_a[i]})"
            ),
        )

    def _violations(
        self, check: str, p: int, where: npt.NDArray[np.bool_], offsets: Ints, values: Ints, say: Callable[[int], str]
    ) -> None:
        """Rows `where` of one partition's `offsets` violate `check`: counted, and the first
        kept with their message (`say(row)`); `values` order the rows of one offset."""
        hits = np.flatnonzero(where)
        if not hits.size:
            return
        self.counts[check] = self.counts.get(check, 0) + int(hits.size)
        kept = self.kept.setdefault(check, [])
        for i in hits[:MAX_REPORTED].tolist():
            kept.append((p, int(offsets[i]), int(values[i]), f"partition {p} offset {offsets[i]}: {say(i)}"))
        kept.sort()
        del kept[MAX_REPORTED:]


@dataclass
class Findings:
    """What every `compare_task` found, added up: each check's first violations in
    (partition, offset) order and their count, the hand-offs, the totals."""

    violations: dict[str, list[str]]
    counts: dict[str, int]
    handoffs: dict[int, int]
    records: int
    made_late: int


def found(rows: pa.Table) -> Findings:
    kind = rows.column("kind").to_numpy()
    listed = rows.to_pylist()
    kept: dict[str, list[tuple[int, int, int, str]]] = {}
    counts: dict[str, int] = {}
    tallies = {"records": 0, "made_late": 0}
    handoffs: dict[int, int] = {}
    for k, r in zip(kind.tolist(), listed):
        if k == Found.VIOLATION:
            kept.setdefault(r["check"], []).append((r["partition"], r["offset"], r["value"], r["message"]))
        elif k == Found.COUNT:
            counts[r["check"]] = counts.get(r["check"], 0) + r["value"]
        elif k == Found.HANDOFF:
            handoffs[r["partition"]] = r["value"]
        else:
            tallies[r["check"]] += r["value"]
    violations = {c: [m for *_, m in sorted(v)[:MAX_REPORTED]] for c, v in sorted(kept.items())}
    return Findings(violations, counts, handoffs, tallies["records"], tallies["made_late"])
