"""The v2 piece index: what is written is what is read back, for any slice range, reading
only the index files (and row groups) of the slices asked for."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keygroups import layout
from keygroups import piece_index as ix
from keygroups.errors import FormatError
from keygroups.storage import open_storage


class CountingStore:
    def __init__(self, inner) -> None:
        self._inner = inner
        self.reads: list[str] = []
        self.ranged_bytes = 0

    def read(self, key: str) -> bytes:
        self.reads.append(key)
        return self._inner.read(key)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        self.reads.append(key)
        self.ranged_bytes += length
        return self._inner.read_range(key, start, length)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def synthetic(slices: int, groups: list[int], empty: set[int]) -> tuple[pa.Table, pa.Table]:
    srows, prows = [], []
    for s in range(slices):
        here = [] if s in empty else groups
        srows.append(
            {
                "slice": s,
                "start_ms": s * 1000,
                "end_ms": (s + 1) * 1000,
                "records": 3 * len(here),
                "bytes": 100 * len(here),
                "partitions": []
                if s in empty
                else [
                    {
                        "partition": 0,
                        "first_offset": 3 * s,
                        "last_offset": 3 * s + 2,
                        "records": 3,
                        "min_timestamp": s * 1000,
                        "max_timestamp": s * 1000 + 999,
                    }
                ],
            }
        )
        for g in here:
            prows.append(
                {
                    "slice": s,
                    "group": g,
                    "file": f"groups/{g:05d}/{s // 5:08d}.avro",
                    "offset": 1000 + s,
                    "length": 100,
                    "records": 3,
                    "min_timestamp": s * 1000,
                    "max_timestamp": s * 1000 + 999,
                    "crc32c": (s * 7919 + g) % 2**32,
                    "file_header": 1000,
                    "file_bytes": 5000,
                }
            )
    return pa.Table.from_pylist(srows, schema=ix.SLICE_SCHEMA), pa.Table.from_pylist(prows, schema=ix.PIECE_SCHEMA)


def in_range(table: pa.Table, first: int, end: int) -> pa.Table:
    s = table.column("slice")
    return table.filter(pc.and_(pc.greater_equal(s, first), pc.less(s, end)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    slices=st.integers(1, 40),
    groups=st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True),
    data=st.data(),
)
def test_any_range_reads_back_what_was_written(tmp_path_factory, monkeypatch, slices, groups, data):
    monkeypatch.setattr(ix, "SLICES_PER_FILE", 8)
    monkeypatch.setattr(ix, "SLICES_PER_ROW_GROUP", 2)
    empty = set(data.draw(st.lists(st.integers(0, slices - 1), max_size=slices)))
    store = open_storage(str(tmp_path_factory.mktemp("ix")))
    sl, pieces = synthetic(slices, sorted(groups), empty)
    # Two runs wrote the index, as after an append: the second from index file `cut` on.
    cut = 8 * data.draw(st.integers(0, (slices - 1) // 8))
    runs = [[0, "a" * 16], [cut, "b" * 16]] if cut else [[0, "b" * 16]]
    shuffled = pieces.take(pa.array(list(reversed(range(pieces.num_rows))), pa.int64()))
    written = ix.write_index(store, in_range(sl, 0, cut), in_range(shuffled, 0, cut), "a" * 16)
    written |= ix.write_index(store, in_range(sl, cut, slices), in_range(shuffled, cut, slices), "b" * 16)
    assert len(written) == 2 * -(-slices // 8)
    ix.write_index(store, sl, pieces, "c" * 16)  # a run that never committed: not read
    first = data.draw(st.integers(0, slices))
    end = data.draw(st.integers(first, slices))
    counting = CountingStore(store)
    index = ix.PieceIndex(counting, slices, runs, written)
    assert index.piece_rows(first, end).equals(in_range(pieces, first, end))
    assert index.slice_rows(first, end).equals(in_range(sl, first, end))
    some = ["slice", "start_ms"]  # what a replay reads of the slice index
    assert index.slice_rows(first, end, some).equals(in_range(sl, first, end).select(some))
    touched = {(int(k.split("/")[1][:10]), k.split("-")[1][:16]) for k in counting.reads}
    assert touched == {(s - s % 8, "b" * 16 if s >= cut else "a" * 16) for s in range(first, end)}
    metas = index.metas(first, end)  # as readers see them: every slice, its pieces by group
    assert [m.slice for m in metas] == list(range(first, end))
    for m in metas:
        assert [p.group for p in m.pieces] == ([] if m.slice in empty else sorted(groups))
        assert m.records == sum(p.records for p in m.pieces) and m.start_ms == m.slice * 1000


def test_a_range_outside_the_archive_and_a_missing_file_are_named(tmp_path):
    store = open_storage(str(tmp_path))
    sl, pieces = synthetic(3, [0, 1], set())
    run = "0" * 16
    ix.write_index(store, sl, pieces, run)
    with pytest.raises(FormatError, match="outside"):
        ix.PieceIndex(store, 3, [[0, run]]).piece_rows(2, 5)
    store.delete(layout.index_key("pieces", 0, run))
    with pytest.raises(FormatError, match="index file missing") as err:
        ix.PieceIndex(store, 3, [[0, run]]).piece_rows(0, 1)
    assert f"0000000000-{run}.pieces.parquet" in str(err.value)
    store.write(layout.index_key("pieces", 0, run), b"not parquet")
    with pytest.raises(FormatError, match="unreadable index file"):
        ix.PieceIndex(store, 3, [[0, run]]).piece_rows(0, 1)
