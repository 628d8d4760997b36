"""Decoding without the `headers` column (`envelope.decode_avro(headers=False)`, what the
Spark source reads without includeHeaders): the same records, less one column."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keygroups import envelope
from keygroups.envelope.decoder import NO_HEADERS_SCHEMA
from tests.test_envelope import damaged, record


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(record, max_size=60), codec=st.sampled_from(envelope.CODECS), block_bytes=st.integers(1, 4096))
def test_without_headers_is_the_batch_less_its_headers(records, codec, block_bytes):
    data = envelope.encode_avro(envelope.batch_from_records(records), codec=codec, block_bytes=block_bytes)
    _, whole = envelope.decode_avro(data)
    _, bare = envelope.decode_avro(data, headers=False)
    assert bare.schema == NO_HEADERS_SCHEMA
    assert bare.equals(whole.drop_columns(["headers"]))
    for name in ("key", "value"):  # no slack in the buffers either
        arr = bare.column(name)
        assert arr.buffers()[2].size == sum(len(v) for v in arr.to_pylist() if v is not None)


@settings(max_examples=200, deadline=None)
@given(
    records=st.lists(record, min_size=1, max_size=10),
    flip=st.integers(0, 10**6),
    codec=st.sampled_from(envelope.CODECS),
)
def test_damage_without_headers_raises_corruptfile_never_crashes(records, flip, codec):
    data = damaged(
        envelope.encode_avro(envelope.batch_from_records(records), codec=codec, block_bytes=200), "flip", 0, flip
    )
    try:
        _, batch = envelope.decode_avro(data, name="chunk.avro", headers=False)
    except envelope.CorruptFile as exc:
        assert "chunk.avro" in str(exc)
    else:
        batch.validate(full=True)
