"""`--format kafka-segments`: Kafka log segments written by an independent writer
(kafka-python's record-batch builder, offsets assigned as a broker does), laid out as a
broker's log directory, decoded equal to kafka-python's own reader, compacted, verified and
replayed exactly once; transaction markers and aborted transactions left out; damage named."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

import reader
from compactor.job import CompactConfig, compact
from compactor.sources import open_source
from compactor.sources.kafka_batches import decode_segment
from compactor.verify import verify
from keygroups.envelope import CorruptFile
from keygroups.storage import open_storage

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


def decoded(batch_) -> list[tuple]:
    return [
        (
            r["offset"],
            round(r["timestamp"].timestamp() * 1000),
            r["key"],
            r["value"],
            [(h["key"], h["value"]) for h in r["headers"]],
        )
        for r in batch_.to_pylist()
    ]


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
    source = open_source(src, format="kafka-segments")
    got = {}
    for chunk in source.list_chunks():
        b = source.read(chunk)
        got.setdefault(chunk.partition, []).extend(
            (r["offset"], round(r["timestamp"].timestamp() * 1000), r["key"], r["value"]) for r in b.to_pylist()
        )
    assert got == expected  # markers and the aborted transaction left out, every other record once
    dest = str(tmp_path / "c")
    r = compact(
        CompactConfig(
            source=src, dest=dest, source_format="kafka-segments", groups=3, slice_duration="10s", seal_all=True
        ),
        spark,
    )
    assert r.records == sum(len(v) for v in expected.values())
    report = verify(open_source(src, format="kafka-segments"), open_storage(dest))
    assert report.ok, report.violations
    seen = []
    with reader.replay(dest, threads=3) as events:
        for ev in events:
            if isinstance(ev, reader.Records):
                seen += zip(ev.batch.column("partition").to_pylist(), ev.batch.column("offset").to_pylist())
    assert sorted(seen) == sorted((p, o) for p, v in expected.items() for o, *_ in v)


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
