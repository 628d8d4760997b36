"""The archive's versions: one manifest per commit (`_versions/<n>.json`), created once and
never replaced; the latest is the archive a new reader sees."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from keygroups.errors import CommitConflict, FormatError, ObjectExists
from keygroups.layout import FORMAT, FORMAT_VERSION, LEGACY_MANIFEST, VERSIONS, version_key
from keygroups.storage import ObjectNotFound, Storage


def dumps(obj: Any) -> bytes:
    """Stable JSON: sorted keys, fixed separators, so equal metadata is equal bytes."""
    return (json.dumps(obj, sort_keys=True, indent=1, separators=(",", ": ")) + "\n").encode()


@dataclass
class Totals:
    """The archive's sums over every version up to this one (an append carries its parent's on)."""

    records: int = 0
    payload_bytes: int = 0
    file_bytes: int = 0
    files: int = 0
    largest_file_bytes: int = 0
    pieces: int = 0
    keys: int = 0
    partitions: int = 0
    slices: int = 0
    empty_slices: int = 0
    end_ms: int | None = None  # end of the last slice holding records (None: none yet)
    made_late: int = 0  # records placed in a sealed slice by --idle-after's choice


@dataclass(frozen=True)
class ArchiveConfig:
    """The settings the archive was compacted with: what an append keeps."""

    groups: int
    slice_duration: str
    slice_duration_ms: int
    codec: str
    block_bytes: int
    target_file_bytes: int
    null_keys: str
    allow_gaps: bool
    seal_all: bool = False
    idle_after: str | None = None


@dataclass(frozen=True)
class SourceRef:
    """Where the records came from: the source's URL, its format and that format's options
    (written beside `url` and `format` in one JSON object)."""

    url: str = ""
    format: str = ""
    options: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "format": self.format, **self.options}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SourceRef:
        rest = dict(d)
        return cls(str(rest.pop("url")), str(rest.pop("format")), rest)


@dataclass(frozen=True)
class LastRecord:
    """A partition's last archived record: what an append checks the source still holds."""

    offset: int
    timestamp: int
    digest: str


# Maps keyed by partition: int keys in memory, JSON strings on disk.
_BY_PARTITION = ("handoff", "running_max", "held_back", "last_records")


@dataclass
class Manifest:
    """One version of the archive (`_versions/<n>.json`): a few KB whatever the archive's
    length (slices are in the index)."""

    source: SourceRef
    config: ArchiveConfig
    topic: str
    groups: int
    slice_duration_ms: int
    base: int  # absolute slice number of slice 0: slice s covers [(base+s)*d, (base+s+1)*d)
    slices: int
    group_records: list[int]
    group_payload_bytes: list[int]  # packing weights: the statistics pass's, an unsealed tail included
    group_file_bytes: list[int]  # bytes of each group's pieces
    totals: Totals
    handoff: dict[int, int]  # partition -> first offset not in the archive
    # partition -> the largest timestamp below its hand-off: the running maximum an append continues from
    running_max: dict[int, int] = field(default_factory=dict)
    # partition -> the last record archived (compactor.history)
    last_records: dict[int, LastRecord] = field(default_factory=dict)
    # index file key -> {bytes, footer_crc32c} of every index file the version names (keygroups.piece_index)
    index_files: dict[str, dict[str, Any]] = field(default_factory=dict)
    # partition -> records of slices not sealed yet when this version was committed (left for
    # a later append; `keyfill report` draws them). Not part of the content id: it says what
    # the source holds beyond the archive, not what the archive holds.
    held_back: dict[int, int] = field(default_factory=dict)
    gaps: list[str] = field(default_factory=list)
    # The version: which archive it is, where its files are, how it came to be.
    archive: str = ""  # the archive's identity: kept by appends, new for each full compaction
    version: int = 0
    parent: int | None = None  # the version this commit followed (None: the first)
    kind: str = "compact"  # compact | append
    created_ms: int = 0
    run: str = ""  # the run that wrote this version's new files
    assignment: str = ""  # key of the key assignment
    index_runs: list[list[Any]] = field(default_factory=list)  # [first slice, run]: who wrote the index from there on
    runs: list[str] = field(default_factory=list)  # the runs whose segment files this version reads
    # segment files of those runs that this version stops reading (and no later one reads):
    # tails an append continued in a file of its own (keygroups.segments); vacuum deletes them
    # once no older version is retained. This version's only, so the manifest stays small.
    dropped: list[str] = field(default_factory=list)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    def bounds(self, s: int) -> tuple[int, int]:
        d = self.slice_duration_ms
        return (self.base + s) * d, (self.base + s + 1) * d

    def to_json(self) -> dict[str, Any]:
        """The JSON object of the version file: partitions as string keys, the source flat."""
        out = asdict(self)
        out["source"] = self.source.to_json()
        for name in _BY_PARTITION:
            out[name] = {str(p): v for p, v in sorted(out[name].items())}
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any], *, name: str = "manifest") -> Manifest:
        if d.get("format") != FORMAT:
            raise FormatError(f"{name}: not a keyfill compacted archive manifest")
        if d.get("format_version") != FORMAT_VERSION:
            raise FormatError(
                f"{name}: format version {d.get('format_version')}; this keyfill reads version {FORMAT_VERSION} "
                "(compact the source again, with --overwrite)"
            )
        d = dict(d)
        for key in _BY_PARTITION:
            if not all(re.fullmatch("[0-9]+", p) for p in d.get(key, {})):
                raise FormatError(f"{name}: {key} names a partition that is not a whole number")
            d[key] = {int(p): v for p, v in d.get(key, {}).items()}
        d["last_records"] = {p: LastRecord(**f) for p, f in d["last_records"].items()}
        typed = {"source": SourceRef.from_json(d["source"]), "config": ArchiveConfig(**d["config"])}
        m = cls(**d | typed | {"totals": Totals(**d["totals"])})
        numbers: list[object] = [*m.group_records, *m.group_payload_bytes, *m.group_file_bytes, *m.handoff.values()]
        numbers += list(m.running_max.values()) + list(m.held_back.values())
        numbers += [m.groups, m.slice_duration_ms, m.base, m.slices, m.version, m.created_ms, m.totals.records]
        numbers += [start for start, _ in m.index_runs]
        numbers += [f for r in m.last_records.values() for f in (r.offset, r.timestamp)]
        lists = (m.group_records, m.group_payload_bytes, m.group_file_bytes)
        if not all(type(v) is int for v in numbers) or any(len(x) != m.groups for x in lists) or m.slices < 0:
            raise FormatError(
                f"{name}: a count, offset or time that is not a whole number, or group lists that do "
                "not match the group count"
            )
        if not m.archive or not m.assignment or (m.slices and not (m.index_runs and m.runs)):
            raise FormatError(f"{name}: no archive id, assignment, index or runs")
        return m


def index_run(index_runs: list[list[Any]], first_slice: int) -> str:
    """The run whose index files cover the slices from `first_slice` (an index file's first
    slice): the last entry of a manifest's `index_runs` starting at or before it."""
    run = ""
    for start, r in index_runs:
        if start > first_slice:
            break
        run = r
    return run


def content_id(manifest: Manifest) -> str:
    """16 hex digits of the SHA-256 of what the archive holds (source, configuration,
    slices, groups, totals, hand-off), not of where its files are: a full compaction's
    archive id. Equal input and configuration give equal ids, so a replay checkpoint or a
    Spark offset resumes against an identical recompaction and refuses any other."""
    content = {k: v for k, v in manifest.to_json().items() if k not in _VERSION_FIELDS}
    return hashlib.sha256(dumps(content)).hexdigest()[:16]


_VERSION_FIELDS = {
    *(
        "archive",
        "version",
        "parent",
        "kind",
        "created_ms",
        "run",
        "assignment",
        "index_runs",
        "runs",
        "index_files",
        "held_back",
    )
}


_VERSION_KEY = re.compile(rf"{VERSIONS}/([0-9]{{20}})\.json")


def version_numbers(keys: Iterable[str]) -> list[int]:
    """The version numbers among these keys (a listing's), ascending."""
    return sorted(int(m[1]) for m in map(_VERSION_KEY.fullmatch, keys) if m)


def versions(store: Storage) -> list[int]:
    """The committed version numbers, ascending."""
    return version_numbers(o.key for o in store.list(VERSIONS + "/"))


def load_manifest(store: Storage, version: int | None = None) -> Manifest:
    """The manifest of `version` (default: the latest), or FormatError: without a version
    there is no archive."""
    if version is None:
        committed = versions(store)
        if not committed:
            if store.exists(LEGACY_MANIFEST):
                return _legacy(store)
            raise FormatError(
                f"{store.url_for(VERSIONS)}/: no committed version; not a compacted archive, or a compaction "
                "that did not finish"
            )
        version = committed[-1]
    key = version_key(version)
    try:
        data = store.read(key)
    except ObjectNotFound:
        raise FormatError(f"{store.url_for(key)}: no version {version} in this archive") from None
    try:
        m = Manifest.from_json(json.loads(data), name=store.url_for(key))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"{store.url_for(key)}: unreadable manifest ({exc})") from None
    if m.version != version:
        raise FormatError(f"{store.url_for(key)}: says it is version {m.version}")
    return m


def _legacy(store: Storage) -> Manifest:
    """An unversioned archive (formats 1 and 2, never released): refused."""
    raise FormatError(legacy_refusal(store))


def legacy_refusal(store: Storage) -> str:
    """What refuses an unversioned archive, naming its manifest and format version."""
    try:
        found = json.loads(store.read(LEGACY_MANIFEST)).get("format_version")
    except (ValueError, AttributeError):
        found = "unknown"
    return (
        f"{store.url_for(LEGACY_MANIFEST)}: compacted with an older keyfill (format version {found}; this one "
        f"reads version {FORMAT_VERSION}): compact the source again into an empty location"
    )


def commit(store: Storage, manifest: Manifest) -> None:
    """Publish `manifest` as its version, atomically and once: if another writer committed
    that version first, CommitConflict, and nothing of this run is visible."""
    manifest.created_ms = manifest.created_ms or int(time.time() * 1000)
    key = version_key(manifest.version)
    try:
        store.create(key, dumps(manifest.to_json()))
    except ObjectExists:
        raise CommitConflict(
            f"{store.url_for(key)}: another compaction committed version {manifest.version} while this one ran; "
            "nothing of this run is visible (its files are left for `keyfill vacuum`). To build on that version, run "
            "this one again with --append (the source's new records) or --overwrite (a version replacing it)"
        ) from None
