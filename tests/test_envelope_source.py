"""Envelope archives on both storage backends: round trip, index from headers, bad input."""

from __future__ import annotations

import io
import uuid

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactor.errors import ArchiveError
from compactor.sources.envelope import build_index, chunk_key, encode_chunk, read_chunk, write_chunk
from keygroups import envelope
from keygroups.envelope import CorruptFile
from keygroups.storage import open_storage

TOPIC = "payments"


def make_records(partition: int, first: int, n: int, t0: int = 1_700_000_000_000, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {
            "partition": partition,
            "offset": first + i,
            "timestamp": t0 + 10 * i - int(rng.integers(0, 50)),
            "key": None if rng.random() < 0.1 else b"k%d" % rng.integers(0, 20),
            "value": rng.bytes(int(rng.integers(0, 60))),
            "headers": [{"key": "h", "value": b"v"}] if i % 3 == 0 else [],
        }
        for i in range(n)
    ]


def scan(store, index) -> dict[tuple[str, int], list[dict]]:
    """Full scan by fastavro, ignoring the index: the reference the index must agree with."""
    out: dict[tuple[str, int], list[dict]] = {}
    for obj in store.list():
        r = fastavro.reader(io.BytesIO(store.read(obj.key)))
        topic = obj.key.split("/")[0]
        for rec in r:
            out.setdefault((topic, rec["partition"]), []).append(rec)
    return out


chunk_plan = st.lists(  # per partition: chunk sizes and gaps before each chunk
    st.lists(st.tuples(st.integers(1, 30), st.integers(0, 3)), min_size=1, max_size=4), min_size=1, max_size=3
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=chunk_plan, codec=st.sampled_from(envelope.CODECS), seed=st.integers(0, 1000))
def test_round_trip_and_index_match_a_full_scan(storage_url, plan, codec, seed):
    store = open_storage(storage_url).sub(f"case-{uuid.uuid4().hex}")
    store.delete_prefix("")
    written: dict[int, list[dict]] = {}
    for p, chunks in enumerate(plan):
        offset = 0
        for size, gap in chunks:
            offset += gap
            recs = make_records(p, offset, size, seed=seed + p)
            write_chunk(store, envelope.batch_from_records(recs), TOPIC, codec=codec)
            written.setdefault(p, []).extend(recs)
            offset += size

    index = build_index(store)
    assert index.topics == [TOPIC]
    assert index.partitions() == list(range(len(plan)))
    assert index.records == sum(len(v) for v in written.values())
    full = scan(store, index)
    for p, recs in written.items():
        chunks = index.partition_chunks(p)
        assert [c.first_offset for c in chunks] == sorted(c.first_offset for c in chunks)
        got = []
        for c in chunks:
            batch = read_chunk(store, c)
            rows = batch.to_pylist()
            assert c.records == len(rows)
            assert c.first_offset == rows[0]["offset"] and c.last_offset == rows[-1]["offset"]
            assert c.min_timestamp == min(round(r["timestamp"].timestamp() * 1000) for r in rows)
            assert c.max_timestamp == max(round(r["timestamp"].timestamp() * 1000) for r in rows)
            got.extend(rows)
        for r in got:
            r["timestamp"] = round(r["timestamp"].timestamp() * 1000)
        assert got == recs  # byte for byte, in offset order
        assert [r["offset"] for r in full[(TOPIC, p)]] == [r["offset"] for r in recs]
    # gaps are reported, not fatal
    expected_gaps = sum(1 for chunks in plan for i, (_, gap) in enumerate(chunks) if gap and i > 0)
    assert len(index.gaps) == expected_gaps


def test_time_range_query(storage_url):
    store = open_storage(storage_url)
    for i in range(5):
        recs = make_records(0, 100 * i, 100, t0=1_000_000 + 1000 * i)
        write_chunk(store, envelope.batch_from_records(recs), TOPIC)
    index = build_index(store)
    everything = index.all_chunks()
    for lo, hi in [(0, 10**12), (2_500_000, 2_600_000), (1_000_500, 1_001_000), (10**9, 10**9 + 1)]:
        got = {c.key for c in index.overlapping(lo, hi)}
        want = set()
        for c in everything:
            ts = read_chunk(store, c).column("timestamp").cast(pa.int64()).to_numpy()
            if ((ts >= lo) & (ts < hi)).any():
                want.add(c.key)
        assert want <= got  # never misses a chunk with records in range
        assert all(c.min_timestamp < hi and c.max_timestamp >= lo for c in index.overlapping(lo, hi))


def test_overlapping_chunks_are_refused_naming_both_files(storage_url):
    store = open_storage(storage_url)
    write_chunk(store, envelope.batch_from_records(make_records(2, 0, 10)), TOPIC)
    write_chunk(store, envelope.batch_from_records(make_records(2, 5, 10)), TOPIC)
    with pytest.raises(ArchiveError) as err:
        build_index(store)
    message = str(err.value)
    assert store.url_for(chunk_key(TOPIC, 2, 5)) in message
    assert store.url_for(chunk_key(TOPIC, 2, 0)) in message
    assert "overlap" in message


def test_truncated_chunk_is_named(storage_url):
    store = open_storage(storage_url)
    key, data = encode_chunk(envelope.batch_from_records(make_records(0, 0, 500)), TOPIC, codec="null")
    store.write(key, data[: len(data) // 2])
    index = build_index(store)  # the header is intact
    with pytest.raises(CorruptFile, match=key.replace("/", ".")):
        read_chunk(store, index.all_chunks()[0])


def test_garbage_file_and_truncated_header_are_named(storage_url):
    store = open_storage(storage_url)
    store.write(chunk_key(TOPIC, 0, 0), b"this is not avro at all")
    with pytest.raises(CorruptFile, match="bad magic"):
        build_index(store)
    key, data = encode_chunk(envelope.batch_from_records(make_records(0, 0, 5)), TOPIC)
    store.write(key, data[:40])
    with pytest.raises(CorruptFile, match="truncated"):
        build_index(store)


def test_name_and_metadata_must_agree(storage_url):
    store = open_storage(storage_url)
    _, data = encode_chunk(envelope.batch_from_records(make_records(1, 0, 5)), TOPIC)
    store.write(chunk_key(TOPIC, 3, 0), data)
    with pytest.raises(ArchiveError, match="metadata says"):
        build_index(store)


def test_empty_archive_is_an_error(storage_url):
    with pytest.raises(ArchiveError, match="no envelope chunks"):
        build_index(open_storage(storage_url))


def test_chunk_must_be_one_partition_in_offset_order():
    bad = make_records(0, 0, 3)
    bad[1]["partition"] = 1
    with pytest.raises(ValueError, match="one partition"):
        encode_chunk(envelope.batch_from_records(bad), TOPIC)
    bad = make_records(0, 0, 3)
    bad[2]["offset"] = 0
    with pytest.raises(ValueError, match="increase"):
        encode_chunk(envelope.batch_from_records(bad), TOPIC)


def test_same_records_same_bytes():
    batch = envelope.batch_from_records(make_records(0, 42, 200))
    assert encode_chunk(batch, TOPIC) == encode_chunk(batch, TOPIC)
