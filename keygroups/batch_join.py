"""Arrow record batches of one schema joined into one, for readers that hand a piece's or a
file's records on as a single batch.

pyarrow has no batch concatenation before 19 (`pa.concat_batches`), and keyfill supports 14
on: a table of the batches with its chunks combined is the same single copy."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa


def join_batches(batches: Sequence[pa.RecordBatch]) -> pa.RecordBatch:
    """One batch of the batches' rows, in order (at least one batch): a lone batch as it is,
    with no copy. Rows of no batch give an empty batch of their schema, where Arrow's table
    would give no batch at all."""
    if len(batches) == 1:
        return batches[0]
    table = pa.Table.from_batches(batches).combine_chunks()
    if not table.num_rows:
        return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in table.schema], schema=table.schema)
    return table.to_batches()[0]
