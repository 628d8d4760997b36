"""keyfill's reader: barrier-synchronised parallel replay of a compacted archive.

    import reader
    with reader.replay("s3://bucket/compacted", threads=16) as events:
        for ev in events:
            if isinstance(ev, reader.Records): ...      # ev.batch: pyarrow.RecordBatch
            elif isinstance(ev, reader.Watermark): ...  # ev.timestamp_ms
            state = events.checkpoint()                 # resume later with resume=state

On Spark, `reader.spark.register(spark)` adds `format("keyfill")` (batch and streaming;
see docs/spark-source.md). It is a submodule so that `import reader` never loads pyspark.
"""

from keygroups._from_zip import files_for

__path__ = files_for(__name__, __path__, __file__)  # noqa: F821 - from a zip: the extracted copy (numba caches)


from reader.checkpoint import CheckpointError
from reader.flink_keyby import consumer_indexes, partition_batches
from reader.options import ReplayOptions
from reader.replay import RECORD_SCHEMA, Records, Replay, ReplayError, Watermark, replay

__all__ = [
    "replay",
    "Replay",
    "ReplayOptions",
    "Records",
    "Watermark",
    "ReplayError",
    "CheckpointError",
    "RECORD_SCHEMA",
    "partition_batches",
    "consumer_indexes",
]
