"""`keyfill inspect` on a compacted archive: its layout and costs, from the manifest alone."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from keyfill.cli.args import iso, mb

if TYPE_CHECKING:
    from keygroups.compacted import Manifest
    from keygroups.storage import Storage


def summary(store: Storage) -> dict[str, Any]:
    from keygroups import compacted

    m = compacted.load_manifest(store)
    t = m.totals
    gb = max(t.file_bytes / 1e9, 1e-9)
    group_bytes = m.group_file_bytes
    mean = sum(group_bytes) / max(1, len(group_bytes))
    return {
        "archive": store.url,
        "format_version": m.format_version,
        "fingerprint": m.archive,
        "version": m.version,
        "topic": m.topic,
        "records": t.records,
        "keys": t.keys,
        "partitions": t.partitions,
        "groups": m.groups,
        "slices": m.slices,
        "empty_slices": t.empty_slices,
        "slice_duration_ms": m.slice_duration_ms,
        "start_ms": m.bounds(0)[0],
        "end_ms": t.end_ms,
        "files": t.files,
        "pieces": t.pieces,
        "file_bytes": t.file_bytes,
        "largest_file_bytes": t.largest_file_bytes,
        "target_file_bytes": m.config.target_file_bytes,
        "replay_gets_per_gb": round(_gets(m) / gb),
        "group_bytes_max_over_mean": round(max(group_bytes) / mean, 3) if mean else None,
        "handoff": m.handoff,
    }


def _gets(m: Manifest) -> int:
    """GETs of a replay with default options: each group's bytes in GET_BYTES ranges (files
    are not listed in the manifest; a group's files add at most one GET each)."""
    from keygroups import compacted

    return compacted.replay_gets(m.group_file_bytes)


def show(store: Storage, as_json: bool) -> int:
    s = summary(store)
    if as_json:
        print(json.dumps(s, indent=2))
        return 0
    print(
        f"archive   {s['archive']} (compacted, format version {s['format_version']}, archive {s['fingerprint']}, "
        f"version {s['version']})"
    )
    print(f"records   {s['records']:,} of topic {s['topic']}, {s['keys']:,} keys, {s['partitions']} partitions")
    end = "none" if s["end_ms"] is None else iso(s["end_ms"])
    print(
        f"slices    {s['slices']:,} of {s['slice_duration_ms'] / 1000:g} s ({s['empty_slices']:,} empty), "
        f"{iso(s['start_ms'])} .. {end}"
    )
    print(
        f"groups    {s['groups']}, largest / mean bytes {s['group_bytes_max_over_mean']}; "
        f"{s['pieces']:,} pieces in {s['files']:,} segment files"
    )
    print(
        f"files     {mb(s['file_bytes'])}, average {mb(s['file_bytes'] // max(1, s['files']))}, largest "
        f"{mb(s['largest_file_bytes'])} (target {mb(s['target_file_bytes'])}); "
        f"a replay makes about {s['replay_gets_per_gb']:,} GETs per GB"
    )
    print("hand-off  " + ", ".join(f"{p}:{o}" for p, o in s["handoff"].items()))
    return 0
