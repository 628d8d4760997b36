"""The last phase of the compaction: slice metadata, then the manifest that makes the
archive visible. Checks that the rewrite wrote exactly what the statistics counted."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compactor.config import CompactConfig, CompactionError
from compactor.slicing import SlicePlan
from keygroups import compacted
from keygroups.compacted import GroupFile, Manifest, SliceMeta, SliceSummary
from keygroups.storage import Storage


def write_slices(dest: Storage, plan: SlicePlan, files: dict[int, list[GroupFile]]) -> list[SliceSummary]:
    summaries = []
    for s in range(plan.slices):
        start, end = plan.bounds(s)
        meta = SliceMeta(
            slice=s,
            start_ms=start,
            end_ms=end,
            partitions=plan.ranges.get(s, []),
            groups=sorted(files.get(s, []), key=lambda g: g.group),
        )
        expected = sum(p.records for p in meta.partitions)
        if meta.records != expected:
            raise CompactionError(
                f"slice {s}: wrote {meta.records} records, statistics counted {expected} (the source changed during "
                "the compaction?)"
            )
        compacted.write_json(dest, compacted.slice_meta_key(s), meta.to_json())
        summaries.append(
            SliceSummary(
                slice=s,
                start_ms=start,
                end_ms=end,
                records=meta.records,
                file_bytes=sum(g.file_bytes for g in meta.groups),
                files=len(meta.groups),
            )
        )
    return summaries


def group_sums(assignment: pa.Table, column: str, groups: int) -> np.ndarray:
    return np.bincount(
        assignment.column("group").to_numpy(), weights=assignment.column(column).to_numpy(), minlength=groups
    ).astype(np.int64)


def write_manifest(
    dest: Storage,
    cfg: CompactConfig,
    source_url: str,
    topic: str,
    plan: SlicePlan,
    assignment: pa.Table,
    summaries: list[SliceSummary],
) -> Manifest:
    """Written last: the archive is visible from here on."""
    group_records = group_sums(assignment, "records", cfg.groups)
    group_bytes = group_sums(assignment, "bytes", cfg.groups)
    manifest = Manifest(
        source={
            "url": source_url,
            "format": cfg.source_format,
            "key_field": cfg.key_field,
            "timestamp_field": cfg.timestamp_field,
        },
        config={
            "groups": cfg.groups,
            "slice_duration": cfg.slice_duration,
            "slice_duration_ms": cfg.slice_duration_ms,
            "codec": cfg.codec,
            "block_bytes": cfg.block_bytes,
            "null_keys": cfg.null_keys,
            "allow_gaps": cfg.allow_gaps,
        },
        topic=topic,
        groups=cfg.groups,
        slice_duration_ms=cfg.slice_duration_ms,
        slices=summaries,
        group_records=group_records.tolist(),
        group_payload_bytes=group_bytes.tolist(),
        totals={
            "records": int(group_records.sum()),
            "payload_bytes": int(group_bytes.sum()),
            "file_bytes": sum(s.file_bytes for s in summaries),
            "files": sum(s.files for s in summaries),
            "keys": int(pc.sum(pc.is_valid(assignment.column("key"))).as_py() or 0),
            "partitions": len(plan.handoff),
            "slices": plan.slices,
        },
        handoff={str(p): o for p, o in sorted(plan.handoff.items())},
        gaps=plan.gaps,
    )
    compacted.write_json(dest, compacted.MANIFEST, manifest.to_json())
    return manifest
