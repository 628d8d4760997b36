"""Small hand-made envelope batches, and shared helpers, for tests (and benchmarks)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from keygroups import envelope
from keygroups.durations import parse_duration


def envelope_records(partition, offsets, ts, keys):
    """Records of one partition at these offsets, timestamps and keys; values name the offset."""
    return envelope.batch_from_records(
        [
            {
                "partition": partition,
                "offset": int(o),
                "timestamp": int(t),
                "key": k,
                "value": b"v%d" % o,
                "headers": [],
            }
            for o, t, k in zip(offsets, ts, keys)
        ]
    )


def copy_archive(src_root: str, dest_url: str):
    """Every object of the archive at `src_root` copied to `dest_url`; the copy's storage."""
    from keygroups.storage import open_storage

    src, dest = open_storage(src_root), open_storage(dest_url)
    for info in src.list():
        dest.write(info.key, src.read(info.key))
    return dest


def copy_share(full: str, dest_url: str, share: float = 1.0) -> None:
    """The first `share` of each partition's chunk files of the generated source `full` into
    the store at `dest_url` (a local folder or a store URL), those there already left as they
    are: a source that grows by new chunk files, as an archiving connector writes them."""
    import os

    from keygroups.storage import open_storage

    store = open_storage(dest_url)
    there = {o.key for o in store.list()}
    for root, _, files in os.walk(full):
        names = sorted(f for f in files if f.endswith(".avro"))
        for name in names[: round(len(names) * share)]:
            key = os.path.relpath(os.path.join(root, name), full).replace(os.sep, "/")
            if key not in there:
                with open(os.path.join(root, name), "rb") as f:
                    store.write(key, f.read())


def archive_metas(store):
    """Every slice of a compacted archive, with its pieces (from the index)."""
    from keygroups import compacted
    from keygroups.piece_index import PieceIndex

    manifest = compacted.load_manifest(store)
    return PieceIndex.of(store, manifest).metas(0, manifest.slices)


def read_pieces(store):
    """(slice, piece, records) of every piece, slice by slice and group by group: what a
    one-thread reader sees."""
    from keygroups import compacted

    out = []
    for meta in archive_metas(store):
        for p in meta.pieces:
            header = store.read_range(p.file, 0, p.file_header)
            out.append((meta, p, compacted.read_piece(header, store.read_range(p.file, p.offset, p.length), p, p.file)))
    return out


def rewrite_group(store, group, change):
    """Rewrite one group's segment files with `change(slice, batch) -> batch` applied to its
    pieces, and its index rows to match (the slice rows stay): damage only an audit against
    the source, or the slice totals, can notice."""
    import pyarrow as pa

    from keygroups import compacted, piece_index
    from keygroups.segments import SegmentWriter

    manifest = compacted.load_manifest(store)
    metas = archive_metas(store)
    mine = [(m.slice, p, b) for m, p, b in read_pieces(store) if p.group == group]
    for f in {p.file for _, p, _ in mine}:
        store.delete(f)
    writer = SegmentWriter(
        store,
        group,
        manifest.run,
        codec=manifest.config.codec,
        block_bytes=manifest.config.block_bytes,
        target_bytes=1 << 40,
    )
    for s, _, b in mine:
        writer.add(s, change(s, b))
    new = writer.close()
    others = [p for m in metas for p in m.pieces if p.group != group]
    pieces = pa.concat_tables([piece_index.piece_table(others), piece_index.piece_table(new)])
    rewrite_index(store, piece_index.slice_table(metas), pieces)
    return new


def rewrite_index(store, slices, pieces):
    """Replace the latest version's index files (written by its run) with these rows, and its
    manifest's record of them: an archive whose index says something else, consistently (to
    test the checks that come after the index's own)."""
    import json

    from keygroups import compacted, piece_index

    manifest = compacted.load_manifest(store)
    written = piece_index.write_index(store, slices, pieces, manifest.run)
    manifest.index_files = {**manifest.index_files, **written}
    store.write(compacted.version_key(manifest.version), compacted.dumps(manifest.to_json()))
    assert json.loads(store.read(compacted.version_key(manifest.version)))["index_files"] == manifest.index_files


def archive_assignment(store):
    """The key assignment of the archive's latest version."""
    from keygroups import compacted
    from keygroups.assignment import load_assignment

    return load_assignment(store, compacted.load_manifest(store).assignment)


def canonical_files(url: str, assignment_rows: bool = False) -> dict:
    """An archive's latest version as invariant 6 compares it: the assignment's and every
    segment file's bytes, the index rows and the manifest, with the run ids (random per
    run, in every file name; an appended archive's runs numbered in their order) and what
    only says when and as which version it was committed taken out. `assignment_rows`: the
    assignment's schema and rows instead of its bytes, to compare archives written with
    different pyarrow releases (a Parquet footer names the one that wrote it)."""
    import io
    import json

    import pyarrow.parquet as pq

    from keygroups import compacted
    from keygroups.storage import open_storage

    store = open_storage(url)
    m = compacted.load_manifest(store)
    runs: list[str] = []  # every version's runs, in their order
    for v in compacted.versions(store):
        doc = json.loads(store.read(compacted.version_key(v)))
        runs += [r for r in [*doc["runs"], doc["run"]] if r not in runs]

    def plain(key: str) -> str:
        for i, run in enumerate(runs):
            key = key.replace(f"-{run}", "" if len(runs) == 1 else f"-run{i}")
        return key

    out: dict = {"assignment": store.read(m.assignment)}
    if assignment_rows:
        table = pq.read_table(io.BytesIO(out["assignment"]))
        out["assignment"] = [str(table.schema.remove_metadata()), table.to_pylist()]
    for o in store.list():
        if o.key.startswith(compacted.GROUPS + "/"):
            assert any(r in o.key for r in runs), f"{o.key}: a file of a run the manifest does not name"
            out[plain(o.key)] = store.read(o.key)
        elif o.key.startswith(compacted.INDEX + "/"):
            rows = pq.read_table(io.BytesIO(store.read(o.key))).to_pylist()
            out[plain(o.key)] = [{k: plain(v) if k == "file" else v for k, v in r.items()} for r in rows]
    for k in ("run", "created_ms", "assignment", "index_runs", "runs"):
        doc.pop(k)
    doc["source"].pop("url")
    # which index files (their bytes name the run's segment files, so their checks differ)
    doc["index_files"] = sorted(plain(k) for k in doc["index_files"])
    doc["dropped"] = [plain(k) if isinstance(k, str) else k for k in doc["dropped"]]
    out["manifest"] = doc
    return out


@dataclass
class Sealed:
    """What a compaction must publish, worked out from the source records alone (the
    independent reference the tests hold manifests to): the slice grid, the sealed slice
    count, each partition's hand-off and running maximum below it, the slice of every
    published record (relative to `base`; an append's records added to its parent's) and
    the records an append placed after their own running maximum's slice (made late)."""

    duration_ms: int
    base: int  # absolute slice number of slice 0
    slices: int  # published slices: [0, slices)
    handoff: dict[int, int]
    running_max: dict[int, int]
    placed: dict[tuple[int, int], int]
    made_late: set[tuple[int, int]]


def sealed_slices(records, duration_ms: int, *, seal_all=False, idle_after_ms=None, after=None) -> Sealed | None:
    """The reference for one compaction (or, with `after`, one append continuing `after`) of
    the source `records`, (partition, offset, timestamp ms) in any order:
    docs/compacted-archive.md, "Slices" and "Sealing", in plain Python. None when nothing (new)
    is sealed.

    A record's slice is that of its partition's running maximum; an append continues each
    partition's running maximum below its hand-off and lifts what falls before its first
    slice into it (made late). A partition's next record lands at or after the slice of its
    running maximum (or the append's first slice), so the seal is the earliest of those over
    the partitions not idle (running maximum more than `idle_after_ms` behind the newest)."""
    by_partition: dict[int, list[tuple[int, int]]] = {p: [] for p in (after.handoff if after else {})}
    for p, o, t in records:
        if after is None or o >= after.handoff.get(p, o):
            by_partition.setdefault(p, []).append((o, t))
    floor = after.base + after.slices if after else None  # an append's first slice (absolute)
    placed: dict[tuple[int, int], int] = {}  # absolute slices, for now
    made_late: set[tuple[int, int]] = set()
    top: dict[int, int] = {}  # each partition's running maximum over all its records
    for p, recs in by_partition.items():
        if after is not None and p in after.running_max:
            top[p] = after.running_max[p]
        for o, t in sorted(recs):
            top[p] = max(top.get(p, t), t)
            own = top[p] // duration_ms
            placed[(p, o)] = own if floor is None else max(own, floor)
            if placed[(p, o)] > own:
                made_late.add((p, o))
    if not placed and after is None:
        return None
    base = after.base if after else min(placed.values())
    first = base + (after.slices if after else 0)
    # Where each partition's next record lands at the earliest: its running maximum, or an
    # append's first slice. Idleness is judged on that too (as compactor/slicing.py does): a
    # partition idle at one append but not idle_after behind the next append's newest partition
    # counting from that append's first slice holds the seal back again.
    held = {p: max(t, first * duration_ms) for p, t in top.items()}
    newest = max(held.values())
    holding = [p for p in held if idle_after_ms is None or held[p] >= newest - idle_after_ms]
    if seal_all:
        seal = max([*placed.values(), first - 1]) + 1
    else:
        seal = min(held[p] // duration_ms for p in holding)
    if seal <= first:
        return None
    handoff = dict(after.handoff) if after else {}
    running_max = dict(after.running_max) if after else {}
    for p, recs in by_partition.items():
        for o, t in sorted(recs):
            if placed[(p, o)] >= seal:
                handoff[p] = o
                break
            handoff[p] = o + 1
            running_max[p] = max(running_max.get(p, t), t)
    published = {k: s - base for k, s in placed.items() if s < seal}
    return Sealed(
        duration_ms,
        base,
        seal - base,
        handoff,
        running_max,
        {**(after.placed if after else {}), **published},
        (after.made_late if after else set()) | {k for k in made_late if k in published},
    )


def source_positions(table) -> list[tuple[int, int, int]]:
    """(partition, offset, timestamp ms) of every record of an envelope table."""
    return list(
        zip(
            table.column("partition").to_pylist(),
            table.column("offset").to_pylist(),
            table.column("timestamp").cast(pa.int64()).to_pylist(),
        )
    )


def check_sealed(store, want: Sealed) -> None:
    """The latest version's manifest and slice index against the reference: slice grid and
    count, hand-off and running maximum per partition, made-late count, and every slice's
    offset range of every partition."""
    from keygroups import compacted

    m = compacted.load_manifest(store)
    got = (m.base, m.slices, m.handoff, m.running_max, m.totals.made_late)
    expected = (
        want.base,
        want.slices,
        dict(want.handoff),
        dict(want.running_max),
        len(want.made_late),
    )
    assert got == expected, f"(base, slices, handoff, running_max, made_late): manifest {got}, source {expected}"
    ranges: dict[tuple[int, int], list[int]] = {}
    for (p, o), s in want.placed.items():
        r = ranges.setdefault((s, p), [o, o, 0])
        r[0], r[1], r[2] = min(r[0], o), max(r[1], o), r[2] + 1
    index = {
        (meta.slice, r.partition): [r.first_offset, r.last_offset, r.records]
        for meta in archive_metas(store)
        for r in meta.partitions
    }
    assert index == ranges, f"slice ranges: index {sorted(index.items())}, source {sorted(ranges.items())}"


def canonical_version(url: str) -> dict:
    """The latest version of an archive as its readers see it, for comparing two histories
    (invariant 5: a re-run after a failed run writes what an unbroken run writes): the bytes
    of every file the version names (assignment, segment files, through its index), the index
    rows and the manifest, with each run id replaced by its place in the version's `runs` and
    the commit time taken out. Files of failed runs, which no version names, are left out."""
    import io
    import json

    import pyarrow.parquet as pq

    from keygroups import compacted
    from keygroups.piece_index import PieceIndex
    from keygroups.storage import open_storage

    store = open_storage(url)
    m = compacted.load_manifest(store)
    runs = list(dict.fromkeys([*m.runs, *(r for _, r in m.index_runs), m.run]))

    def plain(text: str) -> str:
        for i, r in enumerate(runs):
            text = text.replace(r, f"<run {i}>")
        return text

    pieces = PieceIndex.of(store, m).piece_rows(0, m.slices)
    out = {plain(f): store.read(f) for f in {m.assignment, *pieces.column("file").to_pylist()}}
    for key in m.index_files:
        rows = pq.read_table(io.BytesIO(store.read(key))).to_pylist()
        out[plain(key)] = [{k: plain(v) if k == "file" else v for k, v in r.items()} for r in rows]
    doc = json.loads(plain(store.read(compacted.version_key(m.version)).decode()))
    doc.pop("created_ms")
    doc["index_files"] = sorted(doc["index_files"])  # their checks cover file names, run ids in them
    out["manifest"] = doc
    return out


def below_handoff(table, url: str):
    """The source records a compacted archive must hold, worked out from the source (`table`)
    alone (`sealed_slices`, with the compaction's options from the manifest's config), and the
    manifest and index checked against them (`check_sealed`): an archive that seals a slice too
    many or hands off one offset late fails here, whatever its manifest says. The latest
    version must be a compaction, or appends that the one-shot compaction of the grown source
    equals (no --idle-after, no partition new since): for other histories, `sealed_slices`
    step by step (tests/test_append.py)."""
    from keygroups import compacted
    from keygroups.storage import open_storage

    store = open_storage(url)
    m = compacted.load_manifest(store)
    chain = [m]  # back to the compaction the appends continue, as far as vacuum left the versions
    while chain[-1].kind == "append" and chain[-1].parent in compacted.versions(store):
        chain.append(compacted.load_manifest(store, chain[-1].parent))
    if len(chain) > 1:  # (a history this misses fails check_sealed, on made_late or the slices)
        assert not any(v.config.idle_after for v in chain), "an appended history with --idle-after"
        assert set(m.handoff) == set(chain[-1].handoff), "partitions new since the compaction"
    idle = m.config.idle_after
    want = sealed_slices(
        source_positions(table),
        m.slice_duration_ms,
        seal_all=m.config.seal_all,
        idle_after_ms=parse_duration(idle) if idle else None,
    )
    assert want is not None, f"{url}: version {m.version} committed, yet the source seals nothing"
    check_sealed(store, want)
    positions = zip(table.column("partition").to_pylist(), table.column("offset").to_pylist())
    return table.filter(pa.array([k in want.placed for k in positions], pa.bool_()))


def decoded(batch) -> list[tuple]:
    """Envelope records as (offset, timestamp ms, key, value, [(header key, value)]) tuples."""
    return [
        (
            r["offset"],
            round(r["timestamp"].timestamp() * 1000),
            r["key"],
            r["value"],
            [(h["key"], h["value"]) for h in r["headers"]],
        )
        for r in batch.to_pylist()
    ]


def replayed(dest: str, threads: int = 3) -> list[tuple[int, int]]:
    """(partition, offset) of every record a replay of the compacted archive emits, in order."""
    import reader

    seen: list[tuple[int, int]] = []
    with reader.replay(dest, threads=threads) as events:
        for ev in events:
            if isinstance(ev, reader.Records):
                seen += zip(ev.batch.column("partition").to_pylist(), ev.batch.column("offset").to_pylist())
    return seen


def redpanda_rows(records: dict[int, list]) -> list[dict]:
    """Rows of a `redpanda_schema()` table: per partition, (offset, timestamp µs, key, value,
    [(header key, value)]) records, partition by partition."""
    return [
        {
            "redpanda": {
                "partition": p,
                "offset": o,
                "timestamp": ts,
                "headers": [{"key": k, "value": v} for k, v in h] or None,  # Redpanda writes no list when empty
                "key": key,
                "timestamp_type": 0,
            },
            "value": value,
        }
        for p, recs in records.items()
        for o, ts, key, value, h in recs
    ]


def redpanda_schema(*, value: bool = True, offset=LongType, header_key=StringType) -> Schema:
    """Redpanda's key_value table (docs.redpanda.com, "Specify Iceberg Schema"): a
    `redpanda` struct of the record's metadata, and the value as binary."""
    fields = [
        NestedField(2, "partition", IntegerType(), required=True),
        NestedField(3, "offset", (offset or LongType)(), required=True),
        NestedField(4, "timestamp", TimestamptzType(), required=True),
        NestedField(
            5,
            "headers",
            ListType(
                6,
                StructType(
                    NestedField(7, "key", header_key(), required=False),
                    NestedField(8, "value", BinaryType(), required=False),
                ),
                element_required=True,
            ),
            required=False,
        ),
        NestedField(9, "key", BinaryType(), required=False),
        NestedField(10, "timestamp_type", IntegerType(), required=False),
    ]
    if offset is None:
        fields = [f for f in fields if f.name != "offset"]
    top = [NestedField(1, "redpanda", StructType(*fields), required=True)]
    if value:
        top.append(NestedField(11, "value", BinaryType(), required=False))
    return Schema(*top)


def spark_task_read(url: str, read_ahead: int, monkeypatch):
    """The Spark source's task read of one input partition holding every group of the
    archive (`reader.spark.split_reader.read_archive`, as a task runs it, with `read_ahead` as given):
    its batches, and the list the task's read budget is put in when the read starts."""
    import reader.fetch
    import reader.spark
    import reader.spark.enumerator
    import reader.spark.split_reader
    from reader.read_budget import ReadBudget

    budgets: list[ReadBudget] = []

    class Counted(ReadBudget):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            budgets.append(self)

    monkeypatch.setattr(reader.fetch, "ReadBudget", Counted)
    monkeypatch.setattr(reader.spark.split_reader, "bounded_read_ahead", lambda wanted, sharers=1: wanted)
    opts = reader.spark.Options.parse({"path": url, "readAheadBytes": str(read_ahead), "numPartitions": "1"})
    planner = reader.spark.enumerator.ArchivePlanner(opts)
    (partition,) = planner.plan(0, planner.manifest.slices)
    return reader.spark.split_reader.read_archive(opts, partition), budgets
