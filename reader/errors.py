"""The reader's errors, each a `keygroups.errors.KeyfillError` (one line naming the object
at fault) that also keeps the builtin base saying what kind it is. Its internal signals
between threads (`slice_merge.ThreadFailed`, `read_budget.ReadStopped`) are not errors a
user meets and stay with the code that raises them."""

from __future__ import annotations

from keygroups.errors import KeyfillError, OptionError


class DataSourceOptionError(OptionError):
    """An option of the keyfill Spark source is missing or malformed; names the option."""


class ArchiveChanged(KeyfillError, ValueError):
    """A query's checkpointed offsets belong to another archive than the one now at its URL."""


class VersionGone(KeyfillError, RuntimeError):
    """A file of the version being read was deleted while it was read, a newer version not
    naming it (a vacuum with a short --retain): names the file and the latest version."""

    @classmethod
    def of(cls, where: str, latest: int) -> VersionGone:
        return cls(
            f"{where}: gone; the version this read opened was deleted while it read it (a vacuum with a short "
            f"--retain) and version {latest} is the latest. Nothing of another version was delivered: start again "
            f"on version {latest}, or resume from the checkpoint if that version holds the same archive (an append "
            "of the one read, or its input compacted again alike: `keyfill versions`)"
        )


class DataLoss(KeyfillError):
    """Offsets the query must read are no longer (or not yet) in the topic: names them."""


class KafkaReadError(KeyfillError):
    """The live phase could not read a range it planned: names topic, partition and offsets."""


class CheckpointError(KeyfillError, ValueError):
    """A checkpoint of another archive, or not a keyfill replay checkpoint at all."""


class ReplayError(KeyfillError, RuntimeError):
    """A read, check or decode failed in a replay thread; names the file, slice and group."""


class RoutingError(KeyfillError, ValueError):
    """A record batch the Flink key router cannot route (`reader.flink_keyby`): names the
    column at fault."""


class NotARecordBatch(KeyfillError, TypeError):
    """The Flink key router was handed something other than a pyarrow.RecordBatch."""


class DataSourceUnavailable(KeyfillError, RuntimeError):
    """The session's Spark lacks what the Spark source needs (the Python Data Source API, or
    filter pushdown): names the Spark and what does work there (`reader.spark.api`)."""
