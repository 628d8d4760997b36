"""The compaction's read of envelope chunks (`envelope.decode_encoded`): each record's own
bytes from the file where they are what `encode_records` writes, else encoded again; always
the batch that decoding the file and encoding its records gives."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keygroups import envelope
from keygroups.envelope import encoder
from tests.test_envelope import damaged, record

SYNC = bytes(range(16))


def varint(n: int, pad: int = 0) -> bytes:
    """Avro's zigzag varint of `n`, with up to `pad` needless zero groups (a longer, still
    valid encoding; 10 bytes at most)."""
    z = ((n << 1) ^ (n >> 63)) & (2**64 - 1)
    groups = []
    while True:
        groups.append(z & 0x7F)
        z >>= 7
        if not z:
            break
    groups += [0] * min(pad, 10 - len(groups))
    return bytes(g | 0x80 for g in groups[:-1]) + bytes(groups[-1:])


def blob(b: bytes, pad: int = 0) -> bytes:
    return varint(len(b), pad) + b


# The varints of a record, any of which another writer may encode with needless groups.
VARINTS = ("partition", "offset", "timestamp", "branch", "length", "count", "item length", "item branch", "end")


def encode(r: dict, pad: int, split: int, negative: bool, where: str = "offset") -> bytes:
    """One record by hand: `pad` needless groups in its varints of kind `where` (VARINTS),
    its headers in blocks of `split` items (0: one block), each count negative (with the
    block's size) when `negative`."""

    def v(n: int, kind: str) -> bytes:
        return varint(n, pad if kind == where else 0)

    out = v(r["partition"], "partition") + v(r["offset"], "offset") + v(r["timestamp"], "timestamp")
    for field in ("key", "value"):
        out += v(0, "branch") if r[field] is None else v(1, "branch") + v(len(r[field]), "length") + r[field]
    items = [
        v(len(h["key"].encode()), "item length")
        + h["key"].encode()
        + (v(0, "item branch") if h["value"] is None else v(1, "item branch") + v(len(h["value"]), "item length"))
        + (h["value"] or b"")
        for h in r["headers"]
    ]
    step = split or max(1, len(items))
    for i in range(0, len(items), step):
        block = b"".join(items[i : i + step])
        n = len(items[i : i + step])
        out += varint(-n) + varint(len(block)) + block if negative else v(n, "count") + block
    return out + v(0, "end")


def container(encoded: list[bytes], codec: str, block_bytes: int) -> bytes:
    records = pa.array(encoded, pa.binary())
    head = envelope.avro_header(codec=codec, metadata=None, sync_marker=SYNC)
    return head + envelope.blocks_of(records, codec=codec, sync_marker=SYNC, block_bytes=block_bytes)


def reference(data: bytes) -> pa.RecordBatch:
    return envelope.encoded_batch(envelope.decode_avro(data)[1])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(record, max_size=40),
    codec=st.sampled_from(envelope.CODECS),
    block_bytes=st.integers(1, 4096),
)
def test_keyfills_files_give_their_own_record_bytes(records, codec, block_bytes):
    """A file keyfill wrote: its records' bytes are what a piece would hold, the fields and
    weights those of the decoded records."""
    batch = envelope.batch_from_records(records)
    data = envelope.encode_avro(batch, codec=codec, block_bytes=block_bytes, sync_marker=SYNC)
    got = envelope.decode_encoded(data, name="chunk.avro")
    assert got.equals(reference(data))
    assert got.column("record").to_pylist() == envelope.encode_records(batch).to_pylist()
    assert got.column("bytes").to_pylist() == envelope.record_bytes(batch).tolist()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(
        st.tuples(
            record.map(lambda r: {**r, "headers": r["headers"] * 20}),  # up to 80: two-byte counts too
            st.integers(0, 2),  # needless varint groups
            st.sampled_from(VARINTS),  # in which of the record's varints
            st.sampled_from([0, 0, 1, 32, 3]),  # headers' items a block (0: one block)
            st.booleans(),  # negative block counts
        ),
        min_size=1,
        max_size=12,
    ),
    codec=st.sampled_from(envelope.CODECS),
    block_bytes=st.integers(1, 4096),
)
def test_other_encodings_of_the_same_records_are_encoded_again(records, codec, block_bytes):
    """Any valid encoding another writer may choose (longer varints, headers in several
    blocks, negative counts; 64 headers as two blocks of 32 are as long as one block): the
    same batch as decoding and encoding, so the archive does not depend on the writer."""
    data = container([encode(r, pad, split, neg, where) for r, pad, where, split, neg in records], codec, block_bytes)
    got = envelope.decode_encoded(data, name="chunk.avro")
    assert got.equals(reference(data))
    assert (
        got.column("record").to_pylist()
        == envelope.encode_records(envelope.batch_from_records([r for r, *_ in records])).to_pylist()
    )


@settings(max_examples=300, deadline=None)
@given(
    records=st.lists(record, min_size=1, max_size=10),
    cut=st.floats(0, 1),
    flip=st.integers(0, 10**6),
    mode=st.sampled_from(["truncate", "flip"]),
    codec=st.sampled_from(envelope.CODECS),
)
def test_a_damaged_file_is_refused_as_the_full_decode_refuses_it(records, cut, flip, mode, codec):
    data = damaged(
        envelope.encode_avro(envelope.batch_from_records(records), codec=codec, block_bytes=200), mode, cut, flip
    )
    try:
        want = reference(data)
    except envelope.CorruptFile as exc:
        with pytest.raises(envelope.CorruptFile) as got:
            envelope.decode_encoded(data, name="<bytes>")
        assert str(got.value) == str(exc)
    else:
        assert envelope.decode_encoded(data).equals(want)


def test_a_header_key_beyond_ascii_is_checked_and_kept_as_written():
    """The walk tells only ASCII keys valid; any other key has the whole decode check it."""
    r = {
        "partition": 0,
        "offset": 5,
        "timestamp": 1,
        "key": b"k",
        "value": b"v",
        "headers": [{"key": "clé", "value": b"x"}],
    }
    data = container([encode({**r, "offset": 4, "headers": []}, 0, 0, False), encode(r, 0, 0, False)], "null", 4096)
    got = envelope.decode_encoded(data, name="chunk.avro")
    assert got.equals(reference(data))
    assert got.column("record")[1].as_py() == encode(r, 0, 0, False)


def test_a_header_key_that_is_not_utf8_is_named():
    r = {"partition": 0, "offset": 5, "timestamp": 1, "key": b"k", "value": b"v", "headers": []}
    good = encode(r, 0, 0, False)
    bad = good[:-1] + varint(1) + blob(b"\xff\xfe") + b"\x00" + b"\x00"
    with pytest.raises(envelope.CorruptFile, match=r"chunk\.avro: a header key is not UTF-8"):
        envelope.decode_encoded(container([bad], "null", 4096), name="chunk.avro")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(record, max_size=40), start=st.integers(0, 5))
def test_leading_fields_are_the_encoded_records_partition_offset_and_timestamp(records, start):
    """The rewrite ships records' encodings alone and reads these three back where it merges."""
    batch = envelope.batch_from_records(records)
    encoded = envelope.encode_records(batch).cast(pa.large_binary())
    start = min(start, len(encoded))
    part, off, ts = encoder.leading_fields(encoded.slice(start))
    assert part.tolist() == batch.column("partition").to_pylist()[start:]
    assert off.tolist() == batch.column("offset").to_pylist()[start:]
    assert ts.tolist() == batch.column("timestamp").cast(pa.int64()).to_pylist()[start:]


@pytest.mark.parametrize("cut", [b"", varint(3), varint(3) + varint(7), b"\x80"])
def test_leading_fields_refuse_a_record_cut_short(cut):
    """Cut within any of the three fields, before or after a whole record."""
    good = varint(1) + varint(2) + varint(3) + b"rest"
    for records in ([cut], [cut, good], [good, cut]):
        with pytest.raises(ValueError, match="shorter than its leading fields"):
            encoder.leading_fields(pa.array(records, pa.large_binary()))
