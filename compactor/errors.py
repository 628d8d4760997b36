"""The compactor's errors, each a `keygroups.errors.KeyfillError` (one line naming the object
at fault, no traceback, from the CLI) that also keeps the builtin base saying what kind it
is: `ValueError` for a source or options keyfill refuses, `RuntimeError` for a run that
failed."""

from __future__ import annotations

from keygroups.errors import KeyfillError


class CompactionError(KeyfillError, RuntimeError):
    """The two passes over the source disagree: the source changed while it was compacted."""


class HistoryChanged(CompactionError):
    """The source's record at an archived offset is not the one the archive holds."""


class HeldBack(KeyfillError, ValueError):
    """More of the source would be held back (in slices not sealed yet) than --max-held-back allows."""


class ArchiveError(KeyfillError, ValueError):
    """The source archive breaks its format: overlapping chunks, metadata that lies, ..."""


class SlicingError(KeyfillError, ValueError):
    """Chunks of a partition overlap, or leave a gap where none is allowed."""


class NothingSealed(SlicingError):
    """No slice (or, for an append, no new slice) is sealed yet: nothing to publish."""


class TaskInputError(KeyfillError, ValueError):
    """Bad input a Spark task found (the message is the task's error, naming the object)."""


class LeaseLost(KeyfillError, RuntimeError):
    """The run's lease went unrenewed long enough that vacuum may have deleted its files."""


class RunInProgress(KeyfillError, RuntimeError):
    """Another compaction or append, started first, is still writing to the destination:
    only one of them could commit the next version."""


class ConnectRequestTooLarge(KeyfillError, RuntimeError):
    """A Spark task's function larger than a Spark Connect request carries, with no run's
    store to hand it through (`compactor.execution.OnSpark`)."""


class TaskCodeMismatch(KeyfillError, RuntimeError):
    """A task function read back from the run's store whose SHA-256 is not the one the
    driver wrote (`compactor.execution.load_task`): replaced or damaged there, and never
    loaded."""
