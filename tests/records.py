"""Small hand-made envelope batches, and shared helpers, for tests (and benchmarks)."""

from __future__ import annotations

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
        codec=manifest.config["codec"],
        block_bytes=manifest.config["block_bytes"],
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


def canonical_files(url: str) -> dict:
    """An archive's latest version as invariant 6 compares it: the assignment's and every
    segment file's bytes, the index rows and the manifest, with the run id (random per
    run, in every file name) and what only says when and as which version it was
    committed taken out."""
    import io
    import json

    import pyarrow.parquet as pq

    from keygroups import compacted
    from keygroups.storage import open_storage

    store = open_storage(url)
    m = compacted.load_manifest(store)

    def plain(key: str) -> str:
        return key.replace(f"-{m.run}", "")

    out = {"assignment": store.read(m.assignment)}
    for o in store.list():
        if o.key.startswith(compacted.GROUPS + "/"):
            assert m.run in o.key, f"{o.key}: a file of another run"
            out[plain(o.key)] = store.read(o.key)
        elif o.key.startswith(compacted.INDEX + "/"):
            rows = pq.read_table(io.BytesIO(store.read(o.key))).to_pylist()
            out[plain(o.key)] = [{k: plain(v) if k == "file" else v for k, v in r.items()} for r in rows]
    doc = json.loads(store.read(compacted.version_key(m.version)))
    for k in ("run", "created_ms", "assignment", "index_runs", "runs"):
        doc.pop(k)
    doc["source"].pop("url")
    # which index files (their bytes name the run's segment files, so their checks differ)
    doc["index_files"] = sorted(plain(k) for k in doc["index_files"])
    out["manifest"] = doc
    return out


def below_handoff(table, url: str):
    """The source records a compacted archive must hold: those below each partition's
    hand-off offset (the rest are in slices not sealed yet, compactor/slicing.py)."""
    import numpy as np
    import pyarrow as pa

    from keygroups import compacted
    from keygroups.storage import open_storage

    handoff = {int(p): o for p, o in compacted.load_manifest(open_storage(url)).handoff.items()}
    parts = table.column("partition").to_numpy()
    limit = np.array([handoff.get(int(p), 0) for p in parts.tolist()], np.int64)
    return table.filter(pa.array(table.column("offset").to_numpy() < limit))


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
