"""`--format kafka-segments`: Kafka log segments written by an independent writer
(kafka-python's record-batch builder, offsets assigned as a broker does), laid out as a
broker's log directory, decoded equal to kafka-python's own reader, compacted, verified and
replayed exactly once; transaction markers and aborted transactions left out; damage named."""

from __future__ import annotations

import base64
import json
import random
import re
import struct
from dataclasses import dataclass

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from compactor.chunks import chunks_from, read_checked
from compactor.job import CompactConfig, compact
from compactor.sources import ArchiveError, open_source
from compactor.sources.kafka_segments.record_batches import decode_segment
from compactor.sources.kafka_segments.tiered import chunk_sizes_codec
from compactor.verify import verify
from keygroups.envelope import CorruptFile
from keygroups.storage import open_storage
from tests.records import decoded, replayed

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


class _ControlBuilder(DefaultRecordBatchBuilder):
    """kafka-python builds data batches only; a transaction marker is a batch with the
    control bit (0x20) set and one record: key (version, type), value (version, epoch)."""

    def _get_attributes(self, include_compression_type=True):
        return super()._get_attributes(include_compression_type) | 0x20


def batch(base, records, codec=0, *, producer=-1, transactional=False, control=None) -> bytes:
    """One v2 batch at `base` (as the broker assigns it: the first 8 bytes, outside the
    CRC) of (timestamp, key, value, headers) records, or a commit/abort marker."""
    cls = _ControlBuilder if control is not None else DefaultRecordBatchBuilder
    b = cls(
        magic=2,
        compression_type=codec,
        is_transactional=transactional or control is not None,
        producer_id=producer,
        producer_epoch=0 if producer >= 0 else -1,
        base_sequence=0 if producer >= 0 else -1,
        batch_size=1 << 30,
    )
    if control is not None:
        b.append(
            0,
            timestamp=records,
            key=struct.pack(">hh", 0, {"abort": 0, "commit": 1}[control]),
            value=struct.pack(">hi", 0, 0),
            headers=[],
        )
    else:
        for i, (ts, key, value, headers) in enumerate(records):
            b.append(i, timestamp=ts, key=key, value=value, headers=headers)
    buf = bytearray(b.build())
    buf[0:8] = struct.pack(">q", base)
    return bytes(buf)


def reference(data: bytes) -> list[tuple]:
    """What kafka-python's reader makes of a segment: data records only."""
    out, mr = [], MemoryRecords(data)
    while mr.has_next():
        b = mr.next_batch()
        if b.is_control_batch:
            continue
        out += [(r.offset, r.timestamp, r.key, r.value, [(k, v) for k, v in r.headers]) for r in b]
    return out


records_st = st.lists(
    st.tuples(
        st.integers(1_600_000_000_000, 1_700_000_000_000),
        st.none() | st.binary(max_size=20),
        st.none() | st.binary(max_size=300),
        st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=3),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(st.tuples(records_st, st.sampled_from(sorted(CODECS.values()))), min_size=1, max_size=6),
    gaps=st.lists(st.integers(0, 3), min_size=6, max_size=6),
)
def test_segments_decode_as_kafka_pythons_reader_reads_them(batches, gaps):
    data, base = b"", 1000
    for (recs, codec), gap in zip(batches, gaps):
        data += batch(base, recs, codec)
        base += len(recs) + gap
    got = decode_segment(data, 7, name="seg.log")
    assert decoded(got) == reference(data)
    assert set(got.column("partition").to_pylist()) == {7}


def write_log_dir(root, seed=3):
    """A broker log directory: topic `payments`, 3 partitions, 3 segments each, every codec,
    headers and null keys, one committed and one aborted transaction (its marker in the
    next segment, the abort in that segment's .txnindex). Returns the expected records per
    partition: (offset, timestamp, key, value)."""
    rng = random.Random(seed)
    store = open_storage(str(root))
    expected = {}
    ts = 1_767_225_600_000
    for p in range(3):
        offset, want = 0, []
        segments = []
        for s in range(3):
            seg_base, data, txn = offset, b"", b""
            for b in range(4):
                codec = list(CODECS.values())[(p + s + b) % 5]
                recs = []
                for _ in range(rng.randrange(5, 40)):
                    ts += rng.randrange(0, 400)
                    key = None if rng.random() < 0.05 else b"user%d" % rng.randrange(60)
                    recs.append((ts - rng.randrange(0, 3_000), key, b"v%d" % rng.randrange(10**6), [("src", b"t")]))
                if s == 1 and b == 1:  # a transaction of producer 42, aborted in the next segment
                    data += batch(offset, recs, codec, producer=42, transactional=True)
                    aborted_range = (offset, offset + len(recs) - 1)
                elif s == 1 and b == 2:  # a committed transaction of producer 43, with its marker
                    data += batch(offset, recs, codec, producer=43, transactional=True)
                    want += [(offset + i, r[0], r[1], r[2]) for i, r in enumerate(recs)]
                    offset += len(recs)
                    data += batch(offset, ts, control="commit", producer=43)
                    offset += 1
                    continue
                else:
                    data += batch(offset, recs, codec)
                    want += [(offset + i, r[0], r[1], r[2]) for i, r in enumerate(recs)]
                offset += len(recs)
            if s == 2:  # the abort marker, and the transaction index entry naming the aborted range
                data += batch(offset, ts, control="abort", producer=42)
                offset += 1
                txn = struct.pack(">hqqqq", 0, 42, aborted_range[0], aborted_range[1], aborted_range[0])
            segments.append((seg_base, data, txn))
        for seg_base, data, txn in segments:
            store.write(f"payments-{p}/{seg_base:020d}.log", data)
            store.write(f"payments-{p}/{seg_base:020d}.index", b"")  # what a broker keeps beside: ignored
            if txn:
                store.write(f"payments-{p}/{seg_base:020d}.txnindex", txn)
        expected[p] = want
    return expected


def test_a_broker_log_dir_compacts_verifies_and_replays_exactly_once(spark, tmp_path):
    expected = write_log_dir(tmp_path / "logs")
    src = str(tmp_path / "logs")
    got = records_of(open_source(src, format="kafka-segments"))
    assert got == expected  # markers and the aborted transaction left out, every other record once
    dest = str(tmp_path / "c")
    records, seen = compact_and_replay(spark, src, dest)
    assert records == sum(len(v) for v in expected.values())
    report = verify(open_source(src, format="kafka-segments"), open_storage(dest))
    assert report.ok, report.violations
    assert sorted(seen) == sorted((p, o) for p, v in expected.items() for o, *_ in v)


def compact_and_replay(spark, src: str, dest: str) -> tuple[int, list[tuple[int, int]]]:
    """Compact the segments at `src` into `dest`: the records compacted and the replay's
    (partition, offset) pairs."""
    r = compact(
        CompactConfig(
            source=src, dest=dest, source_format="kafka-segments", groups=3, slice_duration="10s", seal_all=True
        ),
        spark,
    )
    return r.records, replayed(dest)


def test_damaged_segments_are_named(tmp_path):
    good = batch(0, [(1_700_000_000_000, b"k", b"v" * 50, [])] * 5) + batch(5, [(1_700_000_000_001, b"k", b"w", [])])
    with pytest.raises(CorruptFile, match=r"seg\.log: truncated batch at byte \d+"):
        decode_segment(good[:-3], 0, name="seg.log")
    bad = bytearray(good)
    bad[80] ^= 0xFF
    with pytest.raises(CorruptFile, match=r"seg\.log: CRC-32C mismatch in the batch at byte 0 \(offset 0\)"):
        decode_segment(bytes(bad), 0, name="seg.log")
    old = bytearray(good)
    old[16] = 1  # magic 1: message format v1
    with pytest.raises(CorruptFile, match="magic 1; keyfill reads message format v2"):
        decode_segment(bytes(old), 0, name="seg.log")
    store = open_storage(str(tmp_path))
    store.write("t-0/00000000000000000000.log", good[:-3])
    source = open_source(str(tmp_path), format="kafka-segments")
    (chunk,) = source.list_chunks()
    with pytest.raises(CorruptFile, match=r"t-0/00000000000000000000\.log: truncated batch"):
        source.read(chunk)


@settings(max_examples=300, deadline=None)
@given(recs=records_st, flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=4))
def test_a_malformed_record_is_named_never_misread(recs, flips):
    """Records damaged behind a valid CRC (a writer's bug, not storage damage): the decoder
    raises CorruptFile naming the segment, or decodes what the bytes say; it never reads
    outside the batch, hangs or fails otherwise."""
    import google_crc32c

    data = bytearray(batch(0, recs))
    for at, x in flips:
        data[61 + at % (len(data) - 61)] ^= x
    data[17:21] = struct.pack(">I", google_crc32c.value(bytes(data[21:])))
    try:
        got = decode_segment(bytes(data), 0, name="seg.log")
    except CorruptFile as exc:
        assert "seg.log" in str(exc)
    else:
        assert got.num_rows == len(recs)  # the batch header says how many; damage elsewhere reads as other bytes
        got.validate(full=True)


def test_inspect_reads_a_log_dir(tmp_path, capsys):
    import json

    from keyfill.cli import main

    expected = write_log_dir(tmp_path / "logs", seed=5)
    assert main(["inspect", str(tmp_path / "logs"), "--format", "kafka-segments", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["records"] == sum(len(v) for v in expected.values()) and s["chunks"] == 9
    assert [(p["partition"], p["records"], p["first_offset"], p["last_offset"]) for p in s["partitions"]] == [
        (p, len(v), v[0][0], v[-1][0]) for p, v in sorted(expected.items())
    ]
    assert s["heaviest_keys"] and s["distinct_keys"] <= 60
    assert main(["inspect", str(tmp_path / "logs"), "--format", "kafka-segments", "--no-progress"]) == 0
    assert "payments" in capsys.readouterr().out


# --- KIP-405 tiered storage as the Aiven RemoteStorageManager uploads it ----------------
# An independent writer of the plugin's objects, from its source (ObjectKeyFactory,
# SegmentManifestV1 and KafkaTypeSerdeModule as Jackson writes them, FixedSizeChunkIndex,
# VariableSizeChunkIndex with ChunkSizesBinaryCodec, CompressionChunkEnumeration: one zstd
# frame per chunk with its content size), built on the `zstandard` package and `json`.


def kafka_uuid(rng: random.Random) -> str:
    """A Kafka `Uuid` as `Uuid.toString()` prints it: 16 bytes, URL-safe base64, unpadded."""
    return base64.urlsafe_b64encode(rng.randbytes(16)).rstrip(b"=").decode()


def chunk_sizes_binary(values: list[int]) -> bytes:
    """`ChunkSizesBinaryCodec.encode`."""
    if len(values) <= 1:
        return struct.pack(f">i{len(values)}i", len(values), *values)
    base = min(values[:-1])
    width = max(
        1 if v - base <= 0xFF else 2 if v - base <= 0xFFFF else 3 if v - base <= 0xFFFFFF else 4 for v in values[:-1]
    )
    body = b"".join((v - base).to_bytes(4, "big")[4 - width :] for v in values[:-1])
    return struct.pack(">iib", len(values), base, width) + body + struct.pack(">i", values[-1])


@dataclass
class Upload:
    """One remote segment: the broker's segment bytes and what RemoteLogSegmentMetadata says."""

    segment: bytes
    start: int
    end: int
    txn: bytes = b""
    epoch: int = 0
    compression: bool = False
    chunk_size: int = 4096
    encrypted: bool = False
    segment_id: str | None = None


def upload(store, prefix: str, topic: str, topic_id: str, partition: int, u: Upload, rng: random.Random) -> str:
    """Write the plugin's three objects for `u`; returns the key stem."""
    seg_id = u.segment_id or kafka_uuid(rng)
    stem = f"{prefix}{topic}-{topic_id}/{partition}/{u.start:020d}-{seg_id}"
    pieces = [u.segment[i : i + u.chunk_size] for i in range(0, len(u.segment), u.chunk_size)] or [b""]
    if u.compression:
        z = zstandard.ZstdCompressor(write_content_size=True)
        stored = [z.compress(p) for p in pieces]
        index = {
            "type": "variable",
            "originalChunkSize": u.chunk_size,
            "originalFileSize": len(u.segment),
            "transformedChunks": base64.b64encode(z.compress(chunk_sizes_binary([len(s) for s in stored]))).decode(),
        }
    else:
        stored = pieces
        index = {
            "type": "fixed",
            "originalChunkSize": u.chunk_size,
            "originalFileSize": len(u.segment),
            "transformedChunkSize": u.chunk_size,
            "finalTransformedChunkSize": len(pieces[-1]),
        }
    store.write(stem + ".log", b"".join(stored))
    # The indexes object: offset, time, producer snapshot, leader epoch, transaction, end to end.
    parts = {
        "offset": struct.pack(">ii", 0, 0),
        "timestamp": struct.pack(">qi", 1_767_225_600_000, 0),
        "producerSnapshot": b"\x00\x01" + rng.randbytes(30),
        "leaderEpoch": f"0\n1\n{u.epoch} {u.start}\n".encode(),
        "transaction": u.txn,
    }
    indexes, pos = {}, 0
    for name, data in parts.items():
        if name == "transaction" and not data:
            indexes[name] = None
            continue
        indexes[name] = {"position": pos, "size": len(data)}
        pos += len(data)
    store.write(stem + ".indexes", b"".join(parts.values()))
    manifest = {"version": "1", "chunkIndex": index, "segmentIndexes": indexes, "compression": u.compression}
    if u.encrypted:
        manifest["encryption"] = {"dataKey": "key1:" + base64.b64encode(rng.randbytes(256)).decode(), "aad": "CgsMDQ=="}
    manifest["remoteLogSegmentMetadata"] = {
        "remoteLogSegmentId": {
            "topicIdPartition": {"topicId": topic_id, "topicPartition": {"topic": topic, "partition": partition}},
            "id": seg_id,
        },
        "startOffset": u.start,
        "endOffset": u.end,
        "maxTimestampMs": 1_767_225_600_000,
        "brokerId": 1,
        "eventTimestampMs": 1_767_225_700_000,
        "segmentLeaderEpochs": {str(u.epoch): u.start},
    }
    store.write(stem + ".rsm-manifest", json.dumps(manifest, separators=(",", ":")).encode())
    return stem


def partition_batches(rng: random.Random, p: int, n_batches: int, *, txn_at: int | None = None):
    """A partition's log as a list of (base offset, batch bytes), the records every reader
    must see (offset, timestamp, key, value), and an aborted transaction at batch `txn_at`:
    its transaction index entry and the list position of its abort marker, two batches on."""
    out, want, offset, ts, txn, marker = [], [], 0, 1_767_225_600_000 + p, b"", None
    for b in range(n_batches):
        recs = []
        for _ in range(rng.randrange(3, 25)):
            ts += rng.randrange(0, 300)
            key = None if rng.random() < 0.05 else b"user%d" % rng.randrange(40)
            recs.append((ts - rng.randrange(0, 2_000), key, b"v%d" % rng.randrange(10**6), [("h", b"x")]))
        codec = list(CODECS.values())[(p + b) % 5]
        aborted = b == txn_at
        out.append((offset, batch(offset, recs, codec, producer=7 if aborted else -1, transactional=aborted)))
        if aborted:
            txn = struct.pack(">hqqqq", 0, 7, offset, offset + len(recs) - 1, offset)
        else:
            want += [(offset + i, r[0], r[1], r[2]) for i, r in enumerate(recs)]
        offset += len(recs)
        if txn_at is not None and b == txn_at + 2:
            marker = len(out)
            out.append((offset, batch(offset, ts, control="abort", producer=7)))
            offset += 1
    return out, want, offset, txn, marker


def segment_of(batches, i: int, j: int, log_end: int, **kw) -> Upload:
    """Batches [i, j) as one remote segment, its end offset just before the next batch (or
    the log end): what RemoteLogManager computes from the next segment's base offset."""
    end = batches[j][0] - 1 if j < len(batches) else log_end - 1
    return Upload(b"".join(b for _, b in batches[i:j]), batches[i][0], end, **kw)


def records_of(source) -> dict[int, list[tuple]]:
    got: dict[int, list[tuple]] = {}
    for chunk in source.list_chunks():
        got.setdefault(chunk.partition, []).extend(
            (r["offset"], round(r["timestamp"].timestamp() * 1000), r["key"], r["value"])
            for r in source.read(chunk).to_pylist()
        )
    return got


def write_tiered(store, prefix: str = "tiered/", seed: int = 11) -> tuple[dict, list]:
    """Topic `pay-ments` (a dash in the name), 2 partitions of 3 remote segments: partition 0
    zstd-chunked (variable chunk index), partition 1 plain (fixed); an aborted transaction
    whose index entry sits in the marker's segment's `.indexes`; and a leader failover on
    partition 0: segment 0 uploaded again by the new leader (epoch 1), and a segment spanning
    the tail of segment 1 and the head of segment 2. Chunks of 700 bytes cut through
    batches. Returns the expected records per partition and the overlaps to be reported
    (first, last offset, whole segment dropped)."""
    rng = random.Random(seed)
    topic, topic_id = "pay-ments", kafka_uuid(rng)
    expected = {}
    for p in range(2):
        batches, want, log_end, txn, marker = partition_batches(rng, p, 12, txn_at=4)
        cuts = [0, 4, 8, len(batches)]
        for i, j in zip(cuts, cuts[1:]):
            u = segment_of(
                batches, i, j, log_end, compression=p == 0, chunk_size=700, txn=txn if i <= marker < j else b""
            )
            upload(store, prefix, topic, topic_id, p, u, rng)
        if p == 0:
            again = segment_of(batches, 0, 4, log_end, compression=True, chunk_size=700, epoch=1)
            upload(store, prefix, topic, topic_id, p, again, rng)
            span = segment_of(batches, 6, 10, log_end, compression=True, chunk_size=900, epoch=1, txn=txn)
            upload(store, prefix, topic, topic_id, p, span, rng)
            base = [b for b, _ in batches]
            overlaps = [(0, base[4] - 1, True), (base[6], base[8] - 1, False), (base[8], base[10] - 1, False)]
        expected[p] = want
    return expected, overlaps


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_tiered_storage_compacts_verifies_and_replays_exactly_once(spark, tmp_path, backend, request, capsys):
    from keyfill.cli import main

    src = str(tmp_path / "tiered") if backend == "local" else request.getfixturevalue("s3_url")
    expected, overlaps = write_tiered(open_storage(src), prefix="kafka/")
    source = open_source(src, format="kafka-segments")
    assert records_of(source) == expected  # each offset once, the marker and the aborted transaction left out
    # segment 0's first upload (epoch 0): dropped for its copy; the failover span read from
    # after segment 1; segment 2 from after the span
    assert sorted((o.first, o.last, o.dropped) for o in source.overlaps) == overlaps
    dest = str(tmp_path / "c") if backend == "local" else src + "-compacted"
    records, seen = compact_and_replay(spark, src, dest)
    assert records == sum(len(v) for v in expected.values())
    assert main(["verify", src, dest, "--format", "kafka-segments", "--no-progress"]) == 0
    assert sorted(seen) == sorted((p, o) for p, v in expected.items() for o, *_ in v)
    assert len(seen) == len(set(seen))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    n=st.integers(1, 9),
    cuts=st.sets(st.integers(1, 8), max_size=4),
    extras=st.lists(st.tuples(st.integers(0, 8), st.integers(1, 9), st.integers(0, 3)), max_size=4),
    compression=st.booleans(),
    chunk_size=st.integers(50, 3000),
    handoff=st.integers(0, 300),
)
def test_overlapping_uploads_read_each_offset_once(
    tmp_path_factory, seed, n, cuts, extras, compression, chunk_size, handoff
):
    """Any cover of a partition's log by remote segments, plus any further uploads of
    batch-aligned ranges (leader failovers, retried uploads), in any chunking: every record
    once, in offset order, each further upload reported as an overlap; and an append from
    any hand-off offset (`chunks_from`, then `read_checked`) reads exactly the records at or
    past it."""
    rng = random.Random(seed)
    store = open_storage(str(tmp_path_factory.mktemp("tiered")))
    batches, want, log_end, _, _ = partition_batches(rng, 0, n)
    topic_id = kafka_uuid(rng)
    bounds = [0, *sorted(c for c in cuts if c < n), n]
    for i, j in zip(bounds, bounds[1:]):
        upload(
            store,
            "",
            "t",
            topic_id,
            0,
            segment_of(batches, i, j, log_end, compression=compression, chunk_size=chunk_size),
            rng,
        )
    extra = [(i % n, min(n, i % n + length)) for i, length, _ in extras]
    for (i, j), (_, _, epoch) in zip(extra, extras):
        upload(
            store,
            "",
            "t",
            topic_id,
            0,
            segment_of(batches, i, j, log_end, compression=not compression, epoch=epoch),
            rng,
        )
    source = open_source(store.url, format="kafka-segments")
    assert records_of(source).get(0, []) == want
    assert len(source.overlaps) >= len(extra)
    chunks = source.list_chunks()
    assert all(a.last_offset < b.first_offset for a, b in zip(chunks, chunks[1:]))
    appended = [
        r["offset"] for c in chunks_from(chunks, {0: handoff}) for r in read_checked(source, c, handoff).to_pylist()
    ]
    assert appended == [w[0] for w in want if w[0] >= handoff]


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 2**31 - 1), max_size=50))
def test_chunk_size_lists_decode_as_the_plugin_encodes_them(sizes):
    assert chunk_sizes_codec(chunk_sizes_binary(sizes), "m") == sizes


def test_bad_tiered_segments_are_named(tmp_path):
    rng = random.Random(5)
    batches, _, log_end, _, _ = partition_batches(rng, 0, 6)

    def one(name: str, u: Upload, damage=None) -> tuple:
        store = open_storage(str(tmp_path / name))
        stem = upload(store, "", "t", kafka_uuid(rng), 0, u, rng)
        if damage:
            damage(store, stem)
        return store, stem

    def raises(store, stem, err, pattern, at="read"):
        source = open_source(store.url, format="kafka-segments")
        with pytest.raises(err, match=pattern) as exc:
            for c in source.list_chunks():
                source.read(c)
        assert store.url_for(stem) in str(exc.value)

    whole = segment_of(batches, 0, 6, log_end, compression=True, chunk_size=500)
    # a truncated batch: the segment was cut before upload (the manifest agrees with the object)
    cut = Upload(whole.segment[:-5], whole.start, whole.end, compression=True, chunk_size=500)
    raises(*one("truncated", cut), CorruptFile, r"\.log: truncated batch at byte \d+")
    # a CRC mismatch inside a compressed chunk
    bad = bytearray(whole.segment)
    bad[len(bad) // 2] ^= 0x40
    raises(
        *one("crc", Upload(bytes(bad), whole.start, whole.end, compression=True, chunk_size=500)),
        CorruptFile,
        "CRC-32C mismatch",
    )

    # the manifest names a chunk the object does not hold
    def drop_last_chunk(store, stem):
        m = json.loads(store.read(stem + ".rsm-manifest"))
        sizes = chunk_sizes_codec(
            zstandard.ZstdDecompressor().decompress(base64.b64decode(m["chunkIndex"]["transformedChunks"])), "m"
        )
        store.write(stem + ".log", store.read(stem + ".log")[: -sizes[-1]])

    store, stem = one("missing", whole, drop_last_chunk)
    raises(
        store,
        stem,
        CorruptFile,
        rf"\.log: \d+ bytes, but its manifest's chunk index lists {-(-len(whole.segment) // 500)} chunks",
    )
    store.write(stem + ".log", store.read(stem + ".log")[:100])
    from compactor.sources.kafka_segments.tiered import parse_manifest, segment_bytes

    m = parse_manifest(store.read(stem + ".rsm-manifest"), "x.rsm-manifest")
    with pytest.raises(CorruptFile, match=r"seg\.log: 100 bytes, .*: chunk 0 \(bytes 0\.\.\d+\) is missing"):
        segment_bytes(store.read(stem + ".log"), m, "seg.log")
    # a chunk whose zstd frame is damaged

    def damage_chunk_1(store, stem):
        m = json.loads(store.read(stem + ".rsm-manifest"))
        packed = zstandard.ZstdDecompressor().decompress(base64.b64decode(m["chunkIndex"]["transformedChunks"]))
        first = chunk_sizes_codec(packed, "m")[0]
        data = bytearray(store.read(stem + ".log"))
        data[first : first + 4] = b"\0\0\0\0"  # the frame's magic number
        store.write(stem + ".log", bytes(data))

    raises(*one("frame", whole, damage_chunk_1), CorruptFile, r"\.log: chunk 1 at byte \d+ does not zstd-decompress")
    # an encrypted segment
    enc = Upload(whole.segment, whole.start, whole.end, encrypted=True)
    raises(*one("encrypted", enc), ArchiveError, r"\.rsm-manifest: the segment is encrypted .*does not read encrypted")

    # overlapping segments whose manifests leave offsets in no segment: a missing segment
    store = open_storage(str(tmp_path / "hole"))
    tid = kafka_uuid(rng)
    upload(store, "", "t", tid, 0, segment_of(batches, 0, 2, log_end), rng)
    late = upload(store, "", "t", tid, 0, segment_of(batches, 3, 6, log_end), rng)
    upload(store, "", "t", tid, 0, segment_of(batches, 0, 1, log_end, epoch=2), rng)  # an overlap: fine
    hole = f"offsets {batches[2][0]}..{batches[3][0] - 1} are in no tiered segment"
    raises(store, late, ArchiveError, re.escape(hole))

    # a segment holding offsets past the end offset its manifest says
    lying = segment_of(batches, 0, 6, log_end)
    raises(*one("lying", Upload(lying.segment, lying.start, batches[3][0] - 1)), CorruptFile, "past the end offset")

    # a manifest describing another segment than its key names
    def other_start(store, stem):
        m = json.loads(store.read(stem + ".rsm-manifest"))
        m["remoteLogSegmentMetadata"]["startOffset"] = 1
        store.write(stem + ".rsm-manifest", json.dumps(m).encode())

    raises(*one("misnamed", whole, other_start), CorruptFile, r"\.rsm-manifest: the manifest describes .*, its key")
    # a manifest without its segment object; the same topic under two topic ids
    store, stem = one("nolog", whole, lambda s, k: s.delete(k + ".log"))
    raises(store, stem, ArchiveError, r"\.rsm-manifest: its segment object .*\.log is missing")
    store, stem = one("twoids", whole)
    upload(store, "", "t", kafka_uuid(rng), 0, whole, rng)
    with pytest.raises(
        ArchiveError, match=r"topic t has tiered segments under topic ids \[.*\] \(a deleted and re-created"
    ):
        open_source(store.url, format="kafka-segments").list_chunks()


def test_an_unfinished_upload_is_skipped_and_a_glued_prefix_read(tmp_path, caplog):
    """A `.log` without its manifest is skipped with a warning; a key prefix without a
    trailing `/` (`tiered-t-<id>/...`) still reads as topic `t`, which the manifest names."""
    rng = random.Random(9)
    batches, want, log_end, _, _ = partition_batches(rng, 0, 4)
    store = open_storage(str(tmp_path))
    tid = kafka_uuid(rng)
    upload(store, "tiered-", "t", tid, 0, segment_of(batches, 0, 4, log_end), rng)
    orphan = upload(store, "tiered-", "t", tid, 0, segment_of(batches, 2, 4, log_end), rng)
    store.delete(orphan + ".rsm-manifest")
    source = open_source(store.url, format="kafka-segments")
    assert {c.topic for c in source.list_chunks()} == {"t"}
    assert records_of(source) == {0: want}
    assert "no .rsm-manifest beside it" in caplog.text and orphan in caplog.text
