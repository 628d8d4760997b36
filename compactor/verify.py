"""`keyfill verify SRC DEST`: an audit that proves compaction lost, duplicated and
reordered nothing.

Checks, each reported by name:
- manifest: present, of this format version, totals consistent with the slice metadata;
- checksums: every group file's SHA-256 and CRC-32C, record count and size match its `_slice.json`;
- exactly once: per partition, the compacted records equal the source records as a
  multiset (count and the sum of 64-bit record fingerprints) and their offsets equal the
  source's offsets (no gap, no overlap, no duplicate);
- key order: in every group file each key's records (null keys: per partition) are in
  offset order, and every key lives in exactly the group the assignment gives it;
- slice bounds: every record of slice s lies inside the slice's offset range for its
  partition, ranges of successive slices follow each other, and running-maximum
  timestamps fall inside [start, end) of their slice;
- hand-off: the manifest's next offset per partition is the source's last offset + 1.

The same audit runs on Spark for archives too large for one process: `compactor.verify_spark`.
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
from keygroups.assignment import MISSING, KeyAssignment, load_assignment
from keygroups.storage import Storage

CHECKS = ("manifest", "checksums", "exactly_once", "key_order", "slice_bounds", "handoff")
MAX_REPORTED = 20  # violations listed per check; the count is always exact


@dataclass
class VerifyReport:
    source: str
    dest: str
    records: int = 0
    files: int = 0
    violations: dict[str, list[str]] = field(default_factory=lambda: {c: [] for c in CHECKS})
    counts: dict[str, int] = field(default_factory=lambda: {c: 0 for c in CHECKS})
    not_run: list[str] = field(default_factory=list)  # checks that could not run: never "ok"

    @property
    def ok(self) -> bool:
        return not any(self.counts.values()) and not self.not_run

    def fail(self, check: str, message: str) -> None:
        self.counts[check] += 1
        if len(self.violations[check]) < MAX_REPORTED:
            self.violations[check].append(message)

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "source": self.source,
            "dest": self.dest,
            "records": self.records,
            "files": self.files,
            "violations": self.violations,
            "counts": self.counts,
            "not_run": self.not_run,
        }


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


class FileChecker:
    """Checks one group file on its own: checksum, size, count, key order, group membership,
    slice offset ranges. Picklable, so Spark tasks can run it."""

    def __init__(self, dest: Storage):
        self.dest = dest
        self.assignment = KeyAssignment.from_table(load_assignment(dest))

    def __call__(
        self, meta: compacted.SliceMeta, gf: compacted.GroupFile
    ) -> tuple[pa.RecordBatch, list[tuple[str, str]]]:
        dest = self.dest
        problems: list[tuple[str, str]] = []
        name = dest.url_for(gf.key)
        data = dest.read(gf.key)
        if hashlib.sha256(data).hexdigest() != gf.sha256:
            problems.append(("checksums", f"{name}: SHA-256 differs from {compacted.slice_meta_key(meta.slice)}"))
        elif compacted.crc32c(data) != gf.crc32c:  # the readers' check: must agree with the SHA-256
            problems.append(("checksums", f"{name}: CRC-32C differs from {compacted.slice_meta_key(meta.slice)}"))
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
        parts = batch.column("partition").to_numpy()
        grp = self.assignment.group_of(keys, parts)
        missing = ~null & (grp == MISSING)
        if missing.any():
            problems.append(("key_order", f"{name}: {int(missing.sum())} records with keys not in the assignment"))
        elif (grp[~null] != gf.group).any():
            problems.append(("key_order", f"{name}: holds keys the assignment puts in other groups"))
        for p in np.unique(parts[null]).tolist():
            if self.assignment.null_groups.get(p) != gf.group:
                problems.append(
                    (
                        "key_order",
                        f"{name}: null-key records of partition {p} belong to group "
                        f"{self.assignment.null_groups.get(p)}",
                    )
                )
        # slice bounds
        ranges = {r.partition: r for r in meta.partitions}
        offsets = batch.column("offset").to_numpy()
        for p in np.unique(parts).tolist():
            r = ranges.get(p)
            o = offsets[parts == p]
            if r is None or o.min() < r.first_offset or o.max() > r.last_offset:
                span = "none" if r is None else f"{r.first_offset}..{r.last_offset}"
                problems.append(
                    (
                        "slice_bounds",
                        f"{name}: partition {p} offsets {o.min()}..{o.max()} outside the slice's range {span}",
                    )
                )
        return batch, problems


def plan_audit(source: SourceArchive, dest: Storage):
    """A fresh report and what to audit: manifest, source chunks, slice metadata, group
    files; no plan when the manifest is missing or unreadable (reported)."""
    report = VerifyReport(source=source.url, dest=dest.url)
    try:
        manifest = compacted.load_manifest(dest)
    except compacted.FormatError as exc:
        report.fail("manifest", str(exc))
        report.not_run = [c for c in CHECKS if c != "manifest"]  # nothing to check them against
        return report, None
    chunks = [c for c in source.list_chunks() if c.topic == manifest.topic]
    metas = [compacted.load_slice(dest, s.slice) for s in manifest.slices]
    files = [(m, g) for m in metas for g in m.groups]
    report.files = len(files)
    return report, (manifest, chunks, metas, files)


def verify(source: SourceArchive, dest: Storage, *, threads: int = 8, progress: bool = False) -> VerifyReport:
    from tqdm import tqdm

    report, plan = plan_audit(source, dest)
    if plan is None:
        return report
    manifest, chunks, metas, files = plan

    # Source side: the reference multiset, partition by partition.
    with ThreadPoolExecutor(max_workers=threads) as pool:
        src_batches = list(
            tqdm(
                pool.map(source.read, chunks),
                total=len(chunks),
                desc="verify: source",
                unit="chunk",
                disable=not progress,
            )
        )
    src = _digest(src_batches)
    del src_batches

    # Compacted side.
    checker = FileChecker(dest)

    out_batches, out_slices = [], []
    with ThreadPoolExecutor(max_workers=threads) as pool:
        checked = tqdm(
            pool.map(lambda item: checker(*item), files),
            total=len(files),
            desc="verify: compacted",
            unit="file",
            disable=not progress,
        )
        for (meta, _), (batch, problems) in zip(files, checked):
            out_batches.append(batch)
            out_slices.append(meta.start_ms)
            for name, message in problems:
                report.fail(name, message)
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
                report.fail(
                    "slice_bounds",
                    f"partition {p}: offset {ao[wrong[0]]} is in the slice starting at "
                    f"{start[wrong[0]]}, its running maximum timestamp says otherwise",
                )

    metadata_checks(report, manifest, metas)
    handoff_checks(report, manifest, {p: int(max(o.max() for o in d.offsets)) for p, d in src.items()})
    return report


def metadata_checks(report: VerifyReport, manifest: compacted.Manifest, metas: list[compacted.SliceMeta]) -> None:
    """Slices one duration long whose partition ranges follow each other; manifest totals."""
    last: dict[int, int] = {}
    for m in metas:
        lo, hi = m.start_ms, m.end_ms
        if hi - lo != manifest.slice_duration_ms:
            report.fail("slice_bounds", f"slice {m.slice}: bounds {lo}..{hi} are not one slice duration apart")
        for r in m.partitions:
            if r.first_offset <= last.get(r.partition, -1):
                report.fail(
                    "slice_bounds",
                    f"slice {m.slice}: partition {r.partition} starts at {r.first_offset}, "
                    f"not after the previous slice's {last[r.partition]}",
                )
            last[r.partition] = r.last_offset
    if report.records != manifest.totals["records"]:
        report.fail("manifest", f"files hold {report.records} records, manifest says {manifest.totals['records']}")


def handoff_checks(report: VerifyReport, manifest: compacted.Manifest, last_offsets: dict[int, int]) -> None:
    for p, last in sorted(last_offsets.items()):
        got = manifest.handoff.get(str(p))
        if got != last + 1:
            report.fail("handoff", f"partition {p}: manifest hand-off offset {got}, source's next offset {last + 1}")
