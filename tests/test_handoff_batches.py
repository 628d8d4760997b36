"""Batches handed to Spark by `format("keyfill")` (`reader.spark.rows.coalesced`): decode steps
joined into fewer, larger batches, in order, within the row and byte limits (`keygroups.batch_join`)."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from keygroups.batch_join import join_batches
from reader.spark.rows import coalesced


def _batch(src: int, start: int, n: int, width: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array([src] * n, pa.int32()),
            pa.array(range(start, start + n), pa.int64()),
            pa.array([b"v" * width] * n, pa.binary()),
        ],
        ["src", "id", "value"],
    )


@settings(max_examples=400, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 64)), max_size=30),
    rows=st.integers(1, 1000),
    max_bytes=st.integers(1, 40_000),
)
def test_coalesced_batches_keep_every_row_in_order_within_the_limits(sizes, rows, max_bytes):
    inputs, at = [], 0
    for src, (n, width) in enumerate(sizes):
        inputs.append(_batch(src, at, n, width))
        at += n
    out = list(coalesced(inputs, rows, max_bytes))
    assert [i for b in out for i in b.column("id").to_pylist()] == list(range(at))  # every row once, in order
    kept = [x for x in inputs if x.num_rows]
    runs = [sorted(set(b.column("src").to_pylist())) for b in out if b.num_rows]
    assert [s for run in runs for s in run] == [x.column("src")[0].as_py() for x in kept]  # runs of inputs
    by_src = {x.column("src")[0].as_py(): x for x in kept}
    for run in runs:
        if len(run) > 1:  # a joined batch keeps within both limits; one input alone may pass them
            assert sum(by_src[s].num_rows for s in run) <= rows
            assert sum(by_src[s].nbytes for s in run) <= max_bytes
    for run, nxt in zip(runs, runs[1:]):  # joined greedily: the next input would have passed a limit
        n, size = sum(by_src[s].num_rows for s in run), sum(by_src[s].nbytes for s in run)
        assert n + by_src[nxt[0]].num_rows > rows or size + by_src[nxt[0]].nbytes > max_bytes


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 16)), min_size=1, max_size=12))
def test_joined_batches_hold_every_row_in_order(sizes):
    inputs, at = [], 0
    for src, (n, width) in enumerate(sizes):
        inputs.append(_batch(src, at, n, width))
        at += n
    joined = join_batches(inputs)
    assert joined.schema == inputs[0].schema
    assert joined.column("id").to_pylist() == list(range(at))
    assert joined.column("value").to_pylist() == [v for b in inputs for v in b.column("value").to_pylist()]
    if len(inputs) == 1:
        assert joined is inputs[0]  # a lone batch is handed on as it is
