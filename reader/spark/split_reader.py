"""The task side of `format("keyfill")`: the rows of one input partition, read in a Spark
task. The archive's groups go through the replay's group reader (`reader.fetch.read_groups`);
a live range through the Kafka client, each record tagged with its key's group.

A module of its own, imported by `reader.spark` when a task reads, never at its top: the
decoder and the key hash load numba and their compiled kernels (~0.3 s), and the Python
process Spark starts to plan each streaming query (its start is every query's) only plans."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from keygroups.assignment import cached_assignment
from keygroups.errors import KeyfillError
from keygroups.storage import open_storage
from reader.fetch import read_groups
from reader.kafka_live import KafkaRange, read_range
from reader.memory import bounded_read_ahead
from reader.spark.enumerator import GroupsPartition
from reader.spark.options import Options
from reader.spark.pushdown import RowFilter
from reader.spark.rows import STEP_BYTES, Constants, arrow_schema, coalesced, to_spark_batches


def read_archive(opts: Options, partition: GroupsPartition, rows: RowFilter | None = None) -> Iterator[pa.RecordBatch]:
    """The partition's groups through the replay's group reader, only the records `rows` keeps,
    in batches of up to `batchSize` rows (`coalesced`)."""
    return coalesced(_archive_batches(opts, partition, rows), opts.batch_size)


def _archive_batches(opts: Options, partition: GroupsPartition, rows: RowFilter | None) -> Iterator[pa.RecordBatch]:
    budget = bounded_read_ahead(opts.read_ahead_bytes, os.cpu_count() or 1)  # a task per core at most
    constants = Constants()
    for step, batch in read_groups(
        open_storage(opts.path),
        partition.pieces,
        read_ahead_bytes=budget,
        range_bytes=opts.range_bytes,
        headers=opts.include_headers,  # not decoded unless the query has the column
        step_bytes=STEP_BYTES,
    ):
        slices = np.repeat(step.slice, step.records)
        if partition.bounds is not None and any(map(partition.bounds.cuts, step.slice.tolist())):
            keep = partition.bounds.keep(batch.column("partition").to_numpy(), batch.column("offset").to_numpy())
            if keep is not None:
                batch, slices = batch.filter(keep), slices[keep]
        if rows is not None:
            keep = rows.keep(batch)
            batch, slices = batch.filter(keep), slices[keep]
        yield from to_spark_batches(
            batch,
            partition.topic,
            int(step.group[0]),
            slices,
            opts.batch_size,
            opts.include_headers,
            constants,
            opts.columns,
        )


def read_live(opts: Options, r: KafkaRange) -> Iterator[pa.RecordBatch]:
    """A live offset range, each record's `key_group` by the assignment the range was planned
    with (a key it lacks: null)."""
    if opts.kafka is None:
        raise KeyfillError(f"{opts.path}: no kafka.* options, so no live phase to read")
    group_of = cached_assignment(open_storage(opts.path), r.assignment).group_of
    return read_range(opts.kafka, r, opts.batch_size, arrow_schema(opts.include_headers, opts.columns), group_of)
