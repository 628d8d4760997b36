"""The envelope block encoder against fastavro, the reference Avro implementation."""

from __future__ import annotations

import io
from datetime import datetime, timedelta, timezone

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keygroups import envelope
from tests.avro_reference import read_avro_batch, read_avro_records

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MS = timedelta(milliseconds=1)

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
BYTES = st.binary(max_size=300)
header = st.fixed_dictionaries({"key": st.text(max_size=20), "value": st.none() | st.binary(max_size=40)})
record = st.fixed_dictionaries(
    {
        "partition": INT32,
        "offset": INT64,
        # fastavro's timestamp-millis reader goes through datetime: keep to its range
        "timestamp": st.integers(-62135596800000 + 1, 253402300799999),
        "key": st.none() | BYTES,
        "value": st.none() | BYTES,
        "headers": st.lists(header, max_size=4),
    }
)


def fastavro_records(data: bytes) -> list[dict]:
    return [{**r, "timestamp": (r["timestamp"] - EPOCH) // MS} for r in fastavro.reader(io.BytesIO(data))]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(record, max_size=60),
    codec=st.sampled_from(envelope.CODECS),
    block_bytes=st.integers(1, 4096),
    metadata=st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda k: not k.startswith("avro.")), st.text(max_size=20), max_size=3
    ),
)
def test_encoder_output_reads_back_identically_with_fastavro(records, codec, block_bytes, metadata):
    batch = envelope.batch_from_records(records)
    data = envelope.encode_avro(batch, codec=codec, metadata=metadata, block_bytes=block_bytes)
    reader = fastavro.reader(io.BytesIO(data))
    assert reader.codec == codec
    for k, v in metadata.items():
        assert reader.metadata[k] == v
    assert fastavro_records(data) == records


@settings(max_examples=100, deadline=None)
@given(records=st.lists(record, min_size=1, max_size=40), block_bytes=st.integers(1, 2048))
def test_encoder_is_deterministic_and_matches_fastavro_writer_blocks(records, block_bytes):
    batch = envelope.batch_from_records(records)
    marker = b"0123456789abcdef"
    a = envelope.encode_avro(batch, codec="null", sync_marker=marker, block_bytes=block_bytes)
    b = envelope.encode_avro(batch, codec="null", sync_marker=marker, block_bytes=block_bytes)
    assert a == b
    # With one block, the file equals what fastavro itself writes for the same records.
    ours = envelope.encode_avro(batch, codec="null", sync_marker=marker, block_bytes=1 << 30)
    theirs = io.BytesIO()
    fastavro.writer(theirs, envelope.PARSED_SCHEMA, records, codec="null", sync_marker=marker, sync_interval=1 << 30)
    assert ours == theirs.getvalue()


def test_blocks_are_cut_near_block_bytes():
    records = [
        {"partition": 0, "offset": i, "timestamp": i, "key": b"k", "value": b"v" * 100, "headers": []}
        for i in range(1000)
    ]
    data = envelope.encode_avro(envelope.batch_from_records(records), codec="null", block_bytes=10_000)
    blocks = list(fastavro.block_reader(io.BytesIO(data)))
    assert len(blocks) > 5
    assert all(b.num_records <= 10_000 // 100 + 1 for b in blocks)
    assert sum(b.num_records for b in blocks) == 1000


def test_empty_batch_is_a_valid_file():
    data = envelope.encode_avro(envelope.empty_batch())
    assert fastavro_records(data) == []


def test_unknown_codec_is_named():
    with pytest.raises(ValueError, match="brotli"):
        envelope.encode_avro(envelope.empty_batch(), codec="brotli")


def test_record_bytes_counts_key_value_and_headers():
    records = [
        {"partition": 0, "offset": 0, "timestamp": 0, "key": b"abc", "value": None, "headers": []},
        {
            "partition": 0,
            "offset": 1,
            "timestamp": 0,
            "key": None,
            "value": b"12345",
            "headers": [{"key": "hh", "value": b"xyz"}, {"key": "é", "value": None}],
        },
    ]
    assert envelope.record_bytes(envelope.batch_from_records(records)).tolist() == [3, 5 + 2 + 3 + 2]


def test_corrupt_bytes_name_the_object():
    with pytest.raises(envelope.CorruptFile, match="s3://b/x.avro"):
        read_avro_records(b"Obj\x01garbage", name="s3://b/x.avro")
    with pytest.raises(envelope.CorruptFile, match="bad magic"):
        envelope.read_avro_metadata(b"PAR1....", name="f")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(record, max_size=60), codec=st.sampled_from(envelope.CODECS), block_bytes=st.integers(1, 4096))
def test_fast_decoder_equals_fastavro_reference(records, codec, block_bytes):
    data = envelope.encode_avro(envelope.batch_from_records(records), codec=codec, block_bytes=block_bytes)
    ref_meta, ref = read_avro_batch(data)
    meta, fast = envelope.decode_avro(data)
    assert meta == ref_meta
    assert fast.schema == envelope.ARROW_SCHEMA
    assert fast.equals(ref)


@settings(max_examples=300, deadline=None)
@given(blocks=st.lists(st.binary(max_size=3000), max_size=8), cut=st.integers(0, 5))
def test_snappy_lengths_read_the_preamble_as_the_library_does(blocks, cut):
    """The compiled preamble reader (one pass over every block of a run) against cramjam's
    own per-block call; a preamble cut short is -1, never a wrong length."""
    import cramjam
    import numpy as np

    from keygroups.envelope.framing import snappy_lengths

    raw = [bytes(cramjam.snappy.compress_raw(b)) for b in blocks]
    buf = np.frombuffer(b"".join(raw) or b"\0", np.uint8)
    ends = np.cumsum([len(r) for r in raw]).astype(np.int64)
    starts = ends - np.array([len(r) for r in raw], np.int64)
    assert snappy_lengths(buf, starts, ends).tolist() == [len(b) for b in blocks]
    assert snappy_lengths(buf, starts, ends).tolist() == [cramjam.snappy.decompress_raw_len(r) for r in raw]
    if blocks and len(blocks[0]) >= 128:  # a two-byte preamble cut to `cut` < 2 bytes
        short = min(cut, 1)
        assert snappy_lengths(buf, starts[:1], starts[:1] + short).tolist() == [-1]


@settings(max_examples=100, deadline=None)
@given(records=st.lists(record, min_size=1, max_size=30), block_bytes=st.integers(1, 2048))
def test_verified_snappy_skips_only_the_block_checksum(records, block_bytes):
    """`verified` (bytes already checked by the piece index's CRC-32C) decodes the same, and
    is the only way a wrong snappy block checksum goes unnoticed."""
    data = bytearray(
        envelope.encode_avro(envelope.batch_from_records(records), codec="snappy", block_bytes=block_bytes)
    )
    _, batch = envelope.decode_avro(bytes(data))
    assert envelope.decode_avro(bytes(data), verified=True)[1].equals(batch)
    sync = bytes(data[-16:])  # every block ends with its 4-byte CRC-32 and then the sync marker
    data[-17] ^= 0xFF  # the last block's checksum
    with pytest.raises(envelope.CorruptFile, match="checksum"):
        envelope.decode_avro(bytes(data))
    assert bytes(data[-16:]) == sync
    assert envelope.decode_avro(bytes(data), verified=True)[1].equals(batch)


@settings(max_examples=100, deadline=None)
@given(
    records=st.lists(record, min_size=1, max_size=20),
    block_bytes=st.integers(1, 512),
    codec=st.sampled_from(envelope.CODECS),
    metadata=st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda k: not k.startswith("avro.")), st.text(max_size=20), max_size=3
    ),
)
def test_fast_decoder_reads_fastavro_written_files(records, block_bytes, codec, metadata):
    """Files from other writers (fastavro here: its own header, block sizes and codecs)
    decode the same, metadata included."""
    buf = io.BytesIO()
    fastavro.writer(buf, envelope.PARSED_SCHEMA, records, codec=codec, sync_interval=block_bytes, metadata=metadata)
    meta, fast = envelope.decode_avro(buf.getvalue())
    ref_meta, ref = read_avro_batch(buf.getvalue())
    assert meta == ref_meta
    assert fast.to_pylist() == ref.to_pylist() == envelope.batch_from_records(records).to_pylist()


@settings(max_examples=50, deadline=None)
@given(records=st.lists(record, max_size=30), block_bytes=st.integers(1, 600))
def test_fast_decoder_buffers_hold_exactly_the_data(records, block_bytes):
    """No slack and no views on the file: every data buffer is as long as its strings."""
    data = envelope.encode_avro(envelope.batch_from_records(records), codec="null", block_bytes=block_bytes)
    _, batch = envelope.decode_avro(bytearray(data))  # any bytes-like input
    headers = batch.column("headers").values
    for arr in (batch.column("key"), batch.column("value"), headers.field("key"), headers.field("value")):
        lengths = [len(v) if isinstance(v, bytes) else len(v.encode()) for v in arr.to_pylist() if v is not None]
        assert arr.buffers()[2].size == sum(lengths)
    assert batch.to_pylist() == read_avro_batch(data)[1].to_pylist()


def damaged(data: bytes, mode: str, cut: float, flip: int) -> bytes:
    """`data` cut short at `cut` of its length ("truncate"), or with one byte inverted ("flip")."""
    out = bytearray(data)
    if mode == "truncate":
        return bytes(out[: int(len(out) * cut)])
    out[flip % len(out)] ^= 0xFF
    return bytes(out)


@settings(max_examples=400, deadline=None)
@given(
    records=st.lists(record, min_size=1, max_size=10),
    cut=st.floats(0, 1),
    flip=st.integers(0, 10**6),
    mode=st.sampled_from(["truncate", "flip"]),
    codec=st.sampled_from(envelope.CODECS),
    block_bytes=st.sampled_from([1, 200, envelope.DEFAULT_BLOCK_BYTES]),
)
def test_corrupt_files_raise_corruptfile_never_crash(records, cut, flip, mode, codec, block_bytes):
    encoded = envelope.encode_avro(envelope.batch_from_records(records), codec=codec, block_bytes=block_bytes)
    data = damaged(encoded, mode, cut, flip)
    try:
        _, batch = envelope.decode_avro(data, name="chunk.avro")
    except envelope.CorruptFile as exc:
        assert "chunk.avro" in str(exc)
    else:  # a flip that still decodes must give a valid batch of the schema
        assert batch.schema == envelope.ARROW_SCHEMA
        batch.validate(full=True)


def test_foreign_schema_is_refused():
    buf = io.BytesIO()
    fastavro.writer(buf, {"type": "record", "name": "X", "fields": [{"name": "a", "type": "int"}]}, [{"a": 1}])
    with pytest.raises(envelope.CorruptFile, match="not the keyfill envelope schema"):
        envelope.decode_avro(buf.getvalue(), name="x.avro")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pieces=st.lists(st.lists(record, max_size=25), min_size=1, max_size=6),
    codec=st.sampled_from(envelope.CODECS),
    block_bytes=st.integers(1, 2048),
    data=st.data(),
)
def test_a_run_of_pieces_decodes_from_the_header_and_its_byte_range(pieces, codec, block_bytes, data):
    """Format v2: a segment file is a header and pieces of whole blocks. Any run of
    consecutive pieces, fetched as one byte range and put after the header, decodes to
    exactly those pieces' records; the whole file decodes to all of them."""
    sync = bytes(range(16))
    header = envelope.avro_header(codec=codec, metadata={"keyfill.format": "test"}, sync_marker=sync)
    batches = [envelope.batch_from_records(p) for p in pieces]
    blobs = [envelope.encode_blocks(b, codec=codec, sync_marker=sync, block_bytes=block_bytes) for b in batches]
    whole = header + b"".join(blobs)
    assert envelope.decode_avro(whole)[1].equals(envelope.batch_from_records([r for p in pieces for r in p]))
    assert read_avro_batch(whole)[1].num_rows == sum(map(len, pieces))  # any Avro reader agrees
    first = data.draw(st.integers(0, len(pieces) - 1))
    end = data.draw(st.integers(first + 1, len(pieces)))
    start = len(header) + sum(map(len, blobs[:first]))
    stop = start + sum(map(len, blobs[first:end]))
    _, got = envelope.decode_avro(header + whole[start:stop])
    want = [r for p in pieces[first:end] for r in p]
    assert got.equals(envelope.batch_from_records(want))
