"""Format v2 segment files: pieces decode from their file's header plus their byte range,
files are cut near the target (at most ceil(bytes / target) per group), equal input gives
equal bytes, and damage to a piece is named, not decoded."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keygroups import compacted, envelope, segments
from keygroups.errors import IntegrityError, OptionError
from keygroups.storage import open_storage

record = st.fixed_dictionaries(
    {
        "partition": st.integers(0, 7),
        "offset": st.integers(0, 2**40),
        "timestamp": st.integers(0, 2**41),
        "key": st.none() | st.binary(max_size=20),
        "value": st.none() | st.binary(max_size=400),
        "headers": st.lists(
            st.fixed_dictionaries({"key": st.text(max_size=8), "value": st.none() | st.binary(max_size=8)}),
            max_size=2,
        ),
    }
)


def write_group(root, slices, target, codec):
    store = open_storage(str(root))
    w = segments.SegmentWriter(store, 3, "0" * 16, codec=codec, block_bytes=512, target_bytes=target)
    for s, recs in slices:
        w.add(s, envelope.batch_from_records(recs))
    return store, w.close(), w.files


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pieces=st.lists(st.lists(record, max_size=20), min_size=1, max_size=12),
    gaps=st.lists(st.integers(1, 3), min_size=12, max_size=12),
    target=st.integers(1, 20_000),
    codec=st.sampled_from(envelope.CODECS),
    data=st.data(),
)
def test_pieces_decode_from_their_range_and_files_stay_near_the_target(
    tmp_path_factory, pieces, gaps, target, codec, data
):
    numbers = [sum(gaps[: i + 1]) for i in range(len(pieces))]  # increasing, with empty slices between
    slices = list(zip(numbers, pieces))
    store, written, files = write_group(tmp_path_factory.mktemp("seg"), slices, target, codec)
    assert [p.slice for p in written] == [s for s, recs in slices if recs]
    total = sum(store.size(f) for f in files)
    assert len(files) <= max(1, math.ceil(total / target))  # no group left with several small files
    for f in files[:-1]:
        assert store.size(f) >= target
    by_slice = dict(slices)
    for p in written:
        assert p.file_header == min(q.offset for q in written if q.file == p.file)
        assert p.file_bytes == store.size(p.file)
        header = store.read_range(p.file, 0, p.file_header)
        got = compacted.read_piece(header, store.read_range(p.file, p.offset, p.length), p, p.file)
        assert got.equals(envelope.batch_from_records(by_slice[p.slice]))
    for f in files:  # any run of consecutive pieces decodes in one pass to the same records
        mine = [p for p in written if p.file == f]
        a = data.draw(st.integers(0, len(mine) - 1))
        run = mine[a : data.draw(st.integers(a + 1, len(mine)))]
        if run:
            start = run[0].offset
            span = store.read_range(f, start, run[-1].end - start)
            header = store.read_range(f, 0, run[0].file_header)
            got = compacted.split_span(compacted.read_span(header, span, start, run, f), run)
            assert [b.to_pylist() for b in got] == [
                envelope.batch_from_records(by_slice[p.slice]).to_pylist() for p in run
            ]
    for f in files:  # and each file is one valid Avro container of its pieces in order
        meta, whole = envelope.decode_avro(store.read(f))
        assert meta["keyfill.format"] == segments.SEGMENT_FORMAT and meta["keyfill.group"] == "3"
        recs = [r for p in written if p.file == f for r in by_slice[p.slice]]
        assert whole.equals(envelope.batch_from_records(recs))


def test_equal_input_gives_equal_bytes(tmp_path):
    slices = [
        (s, [{"partition": 0, "offset": s, "timestamp": s, "key": b"k", "value": b"v" * s, "headers": []}])
        for s in range(1, 30)
    ]
    a, _, fa = write_group(tmp_path / "a", slices, 300, "snappy")
    b, _, fb = write_group(tmp_path / "b", slices, 300, "snappy")
    assert fa == fb and [a.read(f) for f in fa] == [b.read(f) for f in fb]


def test_damage_and_misuse_are_named(tmp_path):
    slices = [
        (s, [{"partition": 0, "offset": s, "timestamp": s, "key": None, "value": b"x" * 50, "headers": []}])
        for s in range(5)
    ]
    store, written, _ = write_group(tmp_path, slices, 10_000, "null")
    p = written[2]
    header = store.read_range(p.file, 0, written[0].offset)
    data = bytearray(store.read_range(p.file, p.offset, p.length))
    data[-20] ^= 1
    with pytest.raises(IntegrityError, match=r"slice 2, group 3.*CRC-32C"):
        compacted.read_piece(header, bytes(data), p, p.file)
    with pytest.raises(IntegrityError, match="bytes, the index records"):
        compacted.read_piece(header, bytes(data[:-1]), p, p.file)
    w = segments.SegmentWriter(store, 1, "0" * 16, codec="null", block_bytes=1 << 20, target_bytes=64 << 20)
    w.add(4, envelope.empty_batch())
    with pytest.raises(OptionError, match="slices must increase"):
        w.add(4, envelope.empty_batch())
