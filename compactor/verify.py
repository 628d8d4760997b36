"""`keyfill verify SRC DEST`: an audit that proves compaction lost, duplicated and
reordered nothing.

Checks, each reported by name:
- manifest: present, of this format version, totals consistent with the slice metadata;
- checksums: every group file's SHA-256, record count and size match its `_slice.json`;
- exactly once: per partition, the compacted records equal the source records as a
  multiset (count and the sum of 64-bit record fingerprints) and their offsets equal the
  source's offsets (no gap, no overlap, no duplicate);
- key order: in every group file each key's records (null keys: per partition) are in
  offset order, and every key lives in exactly the group the assignment gives it;
- slice bounds: every record of slice s lies inside the slice's offset range for its
  partition, ranges of successive slices follow each other, and running-maximum
  timestamps fall inside [start, end) of their slice;
- hand-off: the manifest's next offset per partition is the source's last offset + 1.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compactor.sources import SourceArchive
from keygroups import compacted, envelope
from keygroups.storage import Storage

CHECKS = ("manifest", "checksums", "exactly_once", "key_order", "slice_bounds", "handoff")
_MAX_REPORTED = 20  # violations listed per check; the count is always exact


@dataclass
class VerifyReport:
    source: str
    dest: str
    records: int = 0
    files: int = 0
    violations: dict[str, list[str]] = field(default_factory=lambda: {c: [] for c in CHECKS})
    counts: dict[str, int] = field(default_factory=lambda: {c: 0 for c in CHECKS})

    @property
    def ok(self) -> bool:
        return not any(self.counts.values())

    def fail(self, check: str, message: str) -> None:
        self.counts[check] += 1
        if len(self.violations[check]) < _MAX_REPORTED:
            self.violations[check].append(message)

    def to_json(self) -> dict:
        return {"ok": self.ok, "source": self.source, "dest": self.dest, "records": self.records,
                "files": self.files, "violations": self.violations, "counts": self.counts}  # fmt: skip


@dataclass
class _PartitionDigest:
    offsets: list[np.ndarray] = field(default_factory=list)
    tags: list[np.ndarray] = field(default_factory=list)  # source: timestamps; archive: slice start
    fingerprint: int = 0  # sum mod 2**64

    def add(self, offsets: np.ndarray, tags: np.ndarray, fps: np.ndarray) -> None:
        self.offsets.append(offsets)
        self.tags.append(tags)
        self.fingerprint = (self.fingerprint + int(fps.sum(dtype=np.uint64))) % (1 << 64)

    def by_offset(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.offsets:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        o, t = np.concatenate(self.offsets), np.concatenate(self.tags)
        order = np.argsort(o, kind="stable")
        return o[order], t[order]


def _digest(batches: list[pa.RecordBatch], tags: list[int] | None = None) -> dict[int, _PartitionDigest]:
    """Per partition: offsets, fingerprints and a tag per record (the record's timestamp,
    or the start of the slice it was found in when `tags` gives one per batch)."""
    out: dict[int, _PartitionDigest] = {}
    for i, b in enumerate(batches):
        parts = b.column("partition").to_numpy()
        offsets = b.column("offset").to_numpy()
        if tags is None:
            tag = b.column("timestamp").cast(pa.int64()).to_numpy()
        else:
            tag = np.full(b.num_rows, tags[i], np.int64)
        fps = envelope.record_fingerprints(b)
        for p in np.unique(parts).tolist():
            m = parts == p
            out.setdefault(p, _PartitionDigest()).add(offsets[m], tag[m], fps[m])
    return out


def _key_order_violations(batch: pa.RecordBatch) -> list[str]:
    """Keys (null keys per partition) whose records are not in offset order in the file."""
    if batch.num_rows < 2:
        return []
    enc = pc.dictionary_encode(batch.column("key"))
    kid = enc.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    part = batch.column("partition").to_numpy().astype(np.int64)
    off = batch.column("offset").to_numpy()
    pos = np.arange(batch.num_rows)
    order = np.lexsort((pos, kid, part))
    same = (kid[order][1:] == kid[order][:-1]) & (part[order][1:] == part[order][:-1])
    bad = np.flatnonzero(same & (off[order][1:] <= off[order][:-1]))
    out = []
    for i in bad[:3].tolist():
        a, b = order[i], order[i + 1]
        key = batch.column("key")[int(a)].as_py()
        out.append(f"key {key!r} (partition {part[a]}): offset {off[b]} follows {off[a]}")
    return out


def verify(source: SourceArchive, dest: Storage, *, threads: int = 8, progress: bool = False) -> VerifyReport:
    from tqdm import tqdm

    report = VerifyReport(source=source.url, dest=dest.url)
    try:
        manifest = compacted.load_manifest(dest)
    except compacted.FormatError as exc:
        report.fail("manifest", str(exc))
        return report

    # Source side: the reference multiset, partition by partition.
    chunks = [c for c in source.list_chunks() if c.topic == manifest.topic]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        src_batches = list(tqdm(pool.map(source.read, chunks), total=len(chunks), desc="verify: source",
                                unit="chunk", disable=not progress))  # fmt: skip
    src = _digest(src_batches)
    del src_batches

    # Compacted side.
    assignment = compacted.load_assignment(dest)
    keyed = assignment.filter(pc.is_null(assignment.column("null_key_partition")))
    key_values = keyed.column("key").combine_chunks()
    key_groups = keyed.column("group").to_numpy()
    null_groups = {
        p: g
        for p, g in zip(assignment.column("null_key_partition").to_pylist(), assignment.column("group").to_pylist())
        if p is not None
    }
    metas = [compacted.load_slice(dest, s.slice) for s in manifest.slices]
    files = [(m, g) for m in metas for g in m.groups]
    report.files = len(files)

    def check_file(item: tuple[compacted.SliceMeta, compacted.GroupFile]) -> tuple[pa.RecordBatch, list[tuple[str, str]]]:
        meta, gf = item
        problems: list[tuple[str, str]] = []
        name = dest.url_for(gf.key)
        data = dest.read(gf.key)
        if hashlib.sha256(data).hexdigest() != gf.sha256:
            problems.append(("checksums", f"{name}: SHA-256 differs from {compacted.slice_meta_key(meta.slice)}"))
        if len(data) != gf.file_bytes:
            problems.append(("checksums", f"{name}: {len(data)} bytes, metadata says {gf.file_bytes}"))
        try:
            _, batch = envelope.decode_avro(data, name=name)
        except envelope.CorruptFile as exc:
            problems.append(("checksums", str(exc)))
            return envelope.empty_batch(), problems
        if batch.num_rows != gf.records:
            problems.append(("checksums", f"{name}: {batch.num_rows} records, metadata says {gf.records}"))
        problems += [("key_order", f"{name}: {v}") for v in _key_order_violations(batch)]
        # group membership
        keys = batch.column("key")
        null = keys.is_null().to_numpy(zero_copy_only=False)
        idx = pc.index_in(keys, value_set=key_values).to_numpy(zero_copy_only=False)
        parts = batch.column("partition").to_numpy()
        if (~null).any():
            found = idx[~null]
            missing = np.isnan(found.astype(np.float64))
            if missing.any():
                problems.append(("key_order", f"{name}: {int(missing.sum())} records with keys not in the assignment"))
            elif (key_groups[found.astype(np.int64)] != gf.group).any():
                problems.append(("key_order", f"{name}: holds keys the assignment puts in other groups"))
        for p in np.unique(parts[null]).tolist():
            if null_groups.get(p) != gf.group:
                problems.append(("key_order", f"{name}: null-key records of partition {p} belong to group "
                                              f"{null_groups.get(p)}"))  # fmt: skip
        # slice bounds
        ranges = {r.partition: r for r in meta.partitions}
        offsets = batch.column("offset").to_numpy()
        for p in np.unique(parts).tolist():
            r = ranges.get(p)
            o = offsets[parts == p]
            if r is None or o.min() < r.first_offset or o.max() > r.last_offset:
                span = "none" if r is None else f"{r.first_offset}..{r.last_offset}"
                problems.append(("slice_bounds", f"{name}: partition {p} offsets {o.min()}..{o.max()} outside the "
                                                 f"slice's range {span}"))  # fmt: skip
        return batch, problems

    out_batches, out_slices = [], []
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for (meta, _), (batch, problems) in zip(files,  tqdm(pool.map(check_file, files), total=len(files), desc="verify: compacted",
                                    unit="file", disable=not progress)):  # fmt: skip
            out_batches.append(batch)
            out_slices.append(meta.start_ms)
            for check, message in problems:
                report.fail(check, message)
    dst = _digest(out_batches, out_slices)
    report.records = sum(b.num_rows for b in out_batches)
    del out_batches

    # exactly once, partition by partition
    for p in sorted(set(src) | set(dst)):
        (ao, ts), (bo, start) = src.get(p, _PartitionDigest()).by_offset(), dst.get(p, _PartitionDigest()).by_offset()
        if len(ao) != len(bo):
            report.fail("exactly_once", f"partition {p}: source has {len(ao)} records, archive {len(bo)}")
        elif not np.array_equal(ao, bo):
            dup = np.flatnonzero(np.diff(bo) == 0)
            diff = np.flatnonzero(ao != bo)[0]
            extra = f"; offset {bo[dup[0]]} twice" if dup.size else ""
            report.fail("exactly_once", f"partition {p}: offsets differ first at source offset {ao[diff]}{extra}")
        elif src[p].fingerprint != dst[p].fingerprint:
            report.fail("exactly_once", f"partition {p}: same offsets but record contents differ")
        else:  # each record sits in the slice its partition's running maximum timestamp names
            d = manifest.slice_duration_ms
            wrong = np.flatnonzero(np.maximum.accumulate(ts) // d * d != start)
            if wrong.size:
                report.fail("slice_bounds", f"partition {p}: offset {ao[wrong[0]]} is in the slice starting at "
                                            f"{start[wrong[0]]}, its running maximum timestamp says otherwise")  # fmt: skip

    # slice ranges follow each other; manifest totals
    last: dict[int, int] = {}
    for m in metas:
        lo, hi = m.start_ms, m.end_ms
        if hi - lo != manifest.slice_duration_ms:
            report.fail("slice_bounds", f"slice {m.slice}: bounds {lo}..{hi} are not one slice duration apart")
        for r in m.partitions:
            if r.first_offset <= last.get(r.partition, -1):
                report.fail("slice_bounds", f"slice {m.slice}: partition {r.partition} starts at {r.first_offset}, "
                                            f"not after the previous slice's {last[r.partition]}")  # fmt: skip
            last[r.partition] = r.last_offset
    if report.records != manifest.totals["records"]:
        report.fail("manifest", f"files hold {report.records} records, manifest says {manifest.totals['records']}")

    # hand-off offsets
    for p, digest in src.items():
        want = int(max(o.max() for o in digest.offsets)) + 1
        got = manifest.handoff.get(str(p))
        if got != want:
            report.fail("handoff", f"partition {p}: manifest hand-off offset {got}, source's next offset {want}")
    return report
