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
from keygroups.lazy_names import names_from

__path__ = files_for(__name__, __path__, __file__)  # noqa: F821 - from a zip: the extracted copy (numba caches)


# Where each public name is defined: imported on first use, so that the command line can read
# `reader.options`' defaults without loading pyarrow and the replay.
_PUBLIC = {
    "replay": "reader.lockstep",
    "Replay": "reader.lockstep",
    "Records": "reader.lockstep",
    "Watermark": "reader.lockstep",
    "ReplayError": "reader.lockstep",
    "RECORD_SCHEMA": "reader.lockstep",
    "ReplayOptions": "reader.options",
    "CheckpointError": "reader.checkpoint",
    "partition_batches": "reader.flink_keyby",
    "consumer_indexes": "reader.flink_keyby",
}


__getattr__ = names_from(globals(), _PUBLIC)

__all__ = list(_PUBLIC)
