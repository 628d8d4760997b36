"""keyfill's errors: one base type, so the CLI (and a user's code) can tell a problem with
the input, the options or the storage (`KeyfillError`: one line naming the object at fault)
from a bug (anything else: a traceback).

Each error also keeps the builtin base that says what kind it is (`ValueError` for bad
input, `RuntimeError` for a failed run), so `except ValueError` in users' code still works.
"""

from __future__ import annotations


class KeyfillError(Exception):
    """Base of every error keyfill raises on purpose; the message names the object and, where
    there is one, the fix."""


class OptionError(KeyfillError, ValueError):
    """An option or argument out of range; names the option."""


class StorageError(KeyfillError):
    """A storage operation failed; the message names the full URL of the object or bucket."""


class ObjectNotFound(StorageError):
    """The object does not exist (the bucket or directory may): `url` names it, for a caller
    that reports the missing object in an error of its own."""

    def __init__(self, url: str) -> None:
        super().__init__(url)  # the only argument, so a copy pickled to another process is the same
        self.url = url

    def __str__(self) -> str:
        return f"no such object: {self.url}"


class ObjectExists(StorageError):
    """A create-only write found the object already there (another writer made it first)."""


class InvalidKey(StorageError, ValueError):
    """A storage key or prefix that would mean different things on the two backends."""


class CorruptFile(KeyfillError, ValueError):
    """A file that cannot be read as what it claims to be; names the object (and the byte
    or record where known)."""


class HeaderTruncated(KeyfillError):
    """The first bytes fetched of a file stop inside its header: fetch more and retry."""


class FormatError(KeyfillError, ValueError):
    """A compacted archive that is missing, incomplete or of another format version."""


class IntegrityError(FormatError):
    """A group file's bytes differ from what its slice metadata records: corrupted, cut
    short, or another file put in its place."""


class CommitConflict(KeyfillError, RuntimeError):
    """Another compaction committed the version this one was about to."""


class ExecutorsNotEquipped(KeyfillError):
    """A Spark cluster's executors lack what keyfill's tasks need (a package a client cannot
    ship, or access to the archive): they run in the cluster's environment, not the client's."""
