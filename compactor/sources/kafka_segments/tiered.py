"""KIP-405 tiered storage as the open-source Aiven RemoteStorageManager uploads it
(github.com/Aiven-Open/tiered-storage-for-apache-kafka): object keys, the `.rsm-manifest`,
the chunked `.log` object, and the choice among overlapping uploads.

Per remote segment the plugin writes three objects (`ObjectKeyFactory`):

    <prefix><topic>-<topic id>/<partition>/<start offset, 20 digits>-<segment id>.log
    ...                                                                          .indexes
    ...                                                                          .rsm-manifest

(topic and segment ids are Kafka `Uuid`s printed as 22 characters of URL-safe base64). The
`.log` object is the broker's segment cut into chunks of `originalChunkSize` bytes, each
chunk zstd-compressed on its own when the manifest says `compression: true` (one frame per
chunk, content size in the frame header), encrypted when it names an `encryption` key. The
`.indexes` object is the segment's offset, time, producer-snapshot, leader-epoch and
(optional) transaction indexes end to end; the manifest gives each one's position and size.

The manifest is read by hand from its JSON (no library speaks it): the fields are the
plugin's Jackson names (`SegmentManifestV1`, `FixedSizeChunkIndex`, `VariableSizeChunkIndex`,
`ChunkSizesBinaryCodec`, `KafkaTypeSerdeModule`).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import itertools
import json
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import cramjam

from compactor.errors import ArchiveError
from keygroups.errors import CorruptFile

_UUID = r"[A-Za-z0-9_-]{22}"
KEY = re.compile(
    rf"^(?P<stem>(?:.*/)?(?P<topic>[^/]+)-(?P<topic_id>{_UUID})/(?P<part>\d+)/(?P<start>\d{{20}})-(?P<segment>{_UUID}))"
    r"\.(?P<kind>log|indexes|rsm-manifest)$"
)
_T = TypeVar("_T")  # a manifest field's type: str, int, bool or dict, as JSON decodes it


@dataclass(frozen=True)
class SegmentManifest:
    """What keyfill reads of an `.rsm-manifest` (version 1)."""

    chunks: tuple[tuple[int, int], ...]  # per chunk: (original size, stored size)
    compression: bool
    transaction: tuple[int, int] | None  # the transaction index's (position, size) in `.indexes`
    topic: str
    topic_id: str
    partition: int
    segment_id: str
    start: int  # the segment's first offset
    end: int  # its last offset, inclusive (the next segment's base offset - 1, as the broker computed it)
    leader_epoch: int  # the highest leader epoch whose records it holds; -1 when it names none

    @property
    def stored_size(self) -> int:
        return sum(t for _, t in self.chunks)

    @property
    def original_size(self) -> int:
        return sum(o for o, _ in self.chunks)


def _get(obj: Any, path: str, name: str, types: type[_T]) -> _T:
    """`obj[a][b]...` for the dotted `path`, of one of `types`; a missing or mistyped field is
    named with the manifest's URL."""
    cur = obj
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise CorruptFile(f"{name}: the manifest has no {path!r}")
        cur = cur[part]
    if not isinstance(cur, types) or isinstance(cur, bool) != (types is bool):  # JSON true is no int
        raise CorruptFile(f"{name}: the manifest's {path!r} is {cur!r}, not a {types.__name__}")
    return cur


def chunk_sizes_codec(data: bytes, name: str) -> list[int]:
    """`ChunkSizesBinaryCodec`: count int32; one value: int32; more: base int32, bytes per
    value int8, count-1 values of that many big-endian bytes above the base, the last value
    as int32."""
    try:
        (count,) = struct.unpack_from(">i", data, 0)
        if count <= 1:
            if count < 0 or len(data) != 4 + 4 * count:
                raise struct.error("bad length")
            return list(struct.unpack_from(f">{count}i", data, 4))
        base, width = struct.unpack_from(">ib", data, 4)
        if not 1 <= width <= 4 or len(data) != 9 + (count - 1) * width + 4:
            raise struct.error("bad length")
        body = data[9 : 9 + (count - 1) * width]
        out = [int.from_bytes(body[i : i + width], "big") + base for i in range(0, len(body), width)]
        out.append(struct.unpack_from(">i", data, len(data) - 4)[0])
        return out
    except struct.error:
        raise CorruptFile(f"{name}: the manifest's chunkIndex.transformedChunks is not a chunk size list") from None


def _chunks(index: dict[str, Any], name: str) -> tuple[tuple[int, int], ...]:
    """(original, stored) size per chunk, as `AbstractChunkIndex.materializeChunks` lays them out."""
    kind = _get(index, "type", name, str)
    size = _get(index, "originalChunkSize", name, int)
    total = _get(index, "originalFileSize", name, int)
    if size <= 0 or total < 0:
        raise CorruptFile(f"{name}: the manifest's chunk index has chunk size {size}, file size {total}")
    count = -(-total // size)
    if kind == "fixed":
        stored = [_get(index, "transformedChunkSize", name, int)] * (count - 1)
        stored.append(_get(index, "finalTransformedChunkSize", name, int))
    elif kind == "variable":
        text = _get(index, "transformedChunks", name, str)
        try:
            packed = bytes(cramjam.zstd.decompress(base64.b64decode(text, validate=True)))
        except (binascii.Error, cramjam.DecompressionError, ValueError):
            raise CorruptFile(f"{name}: the manifest's chunkIndex.transformedChunks is not base64 zstd") from None
        stored = chunk_sizes_codec(packed, name)
    else:
        raise CorruptFile(f"{name}: unknown chunk index type {kind!r} (the plugin writes 'fixed' or 'variable')")
    if total == 0:  # an empty segment: the plugin's index holds one empty chunk
        return ((0, stored[-1] if stored else 0),)
    if len(stored) != count or min(stored) < 0:
        raise CorruptFile(
            f"{name}: the chunk index lists {len(stored)} chunks; {total} bytes in chunks of {size} make {count}"
        )
    original = [size] * (count - 1) + [total - (count - 1) * size]
    return tuple(zip(original, stored))


def parse_manifest(data: bytes, name: str) -> SegmentManifest:
    """An `.rsm-manifest`. Encrypted segments are refused: their data key is wrapped with the
    broker's RSA key, which keyfill does not hold."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptFile(f"{name}: not a JSON segment manifest ({exc})") from None
    if not isinstance(doc, dict):
        raise CorruptFile(f"{name}: not a JSON segment manifest (a {type(doc).__name__}, not an object)")
    version = _get(doc, "version", name, str)
    if version != "1":
        raise CorruptFile(f"{name}: segment manifest version {version!r}; keyfill reads version '1'")
    if doc.get("encryption") is not None:
        raise ArchiveError(
            f"{name}: the segment is encrypted (its manifest names an encryption data key); keyfill does not "
            "read encrypted tiered storage: copy the topic from a cluster whose RemoteStorageManager has "
            "encryption off, or read the broker's log directory"
        )
    found = _get(doc, "segmentIndexes", name, dict).get("transaction")
    txn = None if found is None else (_get(found, "position", name, int), _get(found, "size", name, int))
    meta = "remoteLogSegmentMetadata"
    epochs = _get(doc, meta, name, dict).get("segmentLeaderEpochs") or {}
    if not isinstance(epochs, dict):
        raise CorruptFile(f"{name}: the manifest's segmentLeaderEpochs is {epochs!r}, not an object")
    try:
        leader_epoch = max((int(e) for e in epochs), default=-1)
    except ValueError:
        raise CorruptFile(f"{name}: the manifest's segmentLeaderEpochs has a key that is not an epoch") from None
    return SegmentManifest(
        chunks=_chunks(_get(doc, "chunkIndex", name, dict), name),
        compression=_get(doc, "compression", name, bool),
        transaction=txn,
        topic=_get(doc, f"{meta}.remoteLogSegmentId.topicIdPartition.topicPartition.topic", name, str),
        topic_id=_get(doc, f"{meta}.remoteLogSegmentId.topicIdPartition.topicId", name, str),
        partition=_get(doc, f"{meta}.remoteLogSegmentId.topicIdPartition.topicPartition.partition", name, int),
        segment_id=_get(doc, f"{meta}.remoteLogSegmentId.id", name, str),
        start=_get(doc, f"{meta}.startOffset", name, int),
        end=_get(doc, f"{meta}.endOffset", name, int),
        leader_epoch=leader_epoch,
    )


def check_manifest(m: SegmentManifest, key: re.Match[str], name: str) -> None:
    """The manifest describes the segment its key names. The key's topic folder may carry the
    tail of a prefix that does not end in `/` (`<prefix><topic>-<id>`): the topic is the
    manifest's, which the folder name must end with."""
    said = (m.topic_id, m.partition, m.start, m.segment_id)
    named = (key["topic_id"], int(key["part"]), int(key["start"]), key["segment"])
    if said != named or not key["topic"].endswith(m.topic):
        raise CorruptFile(
            f"{name}: the manifest describes {(m.topic, *said)} (topic, topic id, partition, start, segment id), its "
            f"key {(key['topic'], *named)}"
        )
    if m.end < m.start:
        raise CorruptFile(f"{name}: end offset {m.end} is before start offset {m.start}")


def check_stored(length: int, m: SegmentManifest, name: str) -> None:
    """Raises CorruptFile, naming the first chunk missing, when the stored `.log` object is
    not `length` bytes as the manifest's chunk index says."""
    if length == m.stored_size:
        return
    ends = list(itertools.accumulate(stored for _, stored in m.chunks))
    at = bisect.bisect_right(ends, length)  # the first chunk not wholly in the object
    pos = ends[at - 1] if at else 0
    missing = (
        f"chunk {at} (bytes {pos}..{pos + m.chunks[at][1] - 1}) is missing"
        if at < len(m.chunks)
        else f"{length - m.stored_size} bytes follow its last chunk"
    )
    raise CorruptFile(
        f"{name}: {length} bytes, but its manifest's chunk index lists {len(m.chunks)} chunks of "
        f"{m.stored_size} bytes: {missing}"
    )


def segment_bytes(data: bytes, m: SegmentManifest, name: str) -> bytes | bytearray:
    """The broker's segment from its stored `.log` object: the chunks as the manifest lays
    them out, each zstd-decompressed on its own when the manifest says compression."""
    check_stored(len(data), m, name)
    if not m.compression:
        return data
    out = bytearray(m.original_size)  # each chunk decompressed in place: half the time of a join
    view, into, pos, at = memoryview(data), memoryview(out), 0, 0
    for i, (original, stored) in enumerate(m.chunks):
        try:
            got = cramjam.zstd.decompress_into(view[pos : pos + stored], into[at : at + original])
        except (cramjam.DecompressionError, ValueError) as exc:
            raise CorruptFile(
                f"{name}: chunk {i} at byte {pos} does not zstd-decompress into the {original} bytes its manifest "
                f"says ({exc})"
            ) from None
        if got != original:
            raise CorruptFile(
                f"{name}: chunk {i} at byte {pos} decompresses to {got} bytes, its manifest says {original}"
            )
        pos += stored
        at += original
    return out


@dataclass(frozen=True)
class Segment:
    """A remote segment as listed: its `.log` object and what its manifest says."""

    key: str  # the `.log` object
    size: int
    manifest: SegmentManifest


@dataclass(frozen=True)
class Overlap:
    """Offsets of `key` that an earlier-chosen segment (`kept`) already supplies."""

    key: str
    first: int
    last: int
    kept: str
    dropped: bool  # the whole segment is covered: it is not read at all


def cover(
    segments: list[Segment], name: Callable[[str], str] = lambda key: key
) -> tuple[list[tuple[Segment, int]], list[Overlap]]:
    """Segments of one partition chosen so that every offset is read from exactly one, as
    (segment, first offset to read). Leader failover can upload the same offsets twice (a new
    leader copies from its own segment boundaries): committed offsets hold the same records on
    every replica, so any copy will do, and the choice only has to be deterministic. In order
    of start offset, a segment reaching past what the chosen ones cover is read from just past
    that point; one that reaches no further is dropped. Among segments starting together the
    longest wins, then the higher leader epoch (the copy the newest leader made, the one Kafka
    keeps referencing), then the smaller segment id. Offsets that no segment claims between
    two chosen ones are missing data (a deleted or never-finished upload): refused."""
    order = sorted(
        segments, key=lambda s: (s.manifest.start, -s.manifest.end, -s.manifest.leader_epoch, s.manifest.segment_id)
    )
    chosen: list[tuple[Segment, int]] = []
    overlaps: list[Overlap] = []
    covered = order[0].manifest.start - 1  # the last offset the chosen segments supply
    for s in order:
        m = s.manifest
        if m.start > covered + 1:
            raise ArchiveError(
                f"{name(s.key)}: partition {m.partition} offsets {covered + 1}..{m.start - 1} are in no tiered segment "
                f"(the one before, {name(chosen[-1][0].key)}, ends at {covered}): a segment object is missing"
            )
        if m.start <= covered:
            overlaps.append(Overlap(s.key, m.start, min(m.end, covered), chosen[-1][0].key, m.end <= covered))
        if m.end > covered:
            chosen.append((s, covered + 1))
            covered = m.end
    return chosen, overlaps
