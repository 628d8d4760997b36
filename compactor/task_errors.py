"""Bad input found inside a Spark task: reported once, not retried, and the job stopped.

A truncated chunk, a damaged Kafka segment or a malformed JSON line fails the same way on
every attempt, yet Spark retries a failed task (`spark.task.maxFailures`, 4 on a cluster),
logs each attempt's executor traceback, and only then fails the job, with the error buried
under them. So a task that meets a deterministic input error (a `KeyfillError` that is not
a storage error: those may pass) does not raise: it records the error in the run's error
object (`_runs/<run>.error.json`, created once: the first error wins), and ends cleanly. The
driver runs each Spark action in a job group of its own and looks for that object while it
waits; when it appears, it cancels the group and raises the error as it was raised in the
task: one line naming the object, and no traceback. Spark has no per-exception
retry policy and no channel from a Python task to the driver other than the storage both
already share, which is why this is written here.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from keygroups import compacted
from keygroups.errors import KeyfillError, ObjectExists, StorageError
from keygroups.storage import Storage

T = TypeVar("T")
POLL_S = 1.0  # how often the driver looks for the error object while a job runs


class TaskInputError(KeyfillError, ValueError):
    """Bad input a Spark task found (the message is the task's error, naming the object)."""


def deterministic(exc: BaseException) -> bool:
    return isinstance(exc, KeyfillError) and not isinstance(exc, StorageError)


class TaskErrors:
    """The error channel of one run: `guard` wraps the tasks, `run` the driver's actions.
    Pickled into the tasks (a store and a key)."""

    def __init__(self, dest: Storage, run: str) -> None:
        self.dest, self.run_id, self.key = dest, run, compacted.run_error_key(run)

    def report(self, exc: BaseException) -> None:
        body = compacted.dumps({"type": type(exc).__name__, "message": str(exc)})
        try:
            self.dest.create(self.key, body)
        except ObjectExists:
            pass  # another task's error was first: one is enough

    def guard(self, task: Callable[[Iterator[Any]], Iterator[Any]]) -> Callable[[Iterator[Any]], Iterator[Any]]:
        """`task` (a mapInArrow or mapPartitions function) that reports a deterministic input
        error and stops, instead of raising it."""

        def run(batches: Iterator[Any]) -> Iterator[Any]:
            try:
                yield from task(batches)
            except Exception as exc:
                if not deterministic(exc):
                    raise
                self.report(exc)

        return run

    def reported(self) -> KeyfillError | None:
        """The error a task reported, as the type it was raised as (TaskInputError if that
        type cannot be built from its message)."""
        try:
            found = json.loads(self.dest.read(self.key))
        except (StorageError, ValueError):
            return None
        message = str(found.get("message", "a Spark task found bad input"))
        kind = _error_types().get(found.get("type"), TaskInputError)
        try:
            return kind(message)
        except TypeError:
            return TaskInputError(message)

    def run(self, sc, description: str, action: Callable[[], T]) -> T:
        """`action()` (a Spark action) in a job group of its own, cancelled as soon as a task
        reports an error, which is then raised here."""
        group = f"keyfill-{self.run_id}-{threading.get_ident()}-{description}"
        result: list = []
        failure: list[BaseException] = []

        def work() -> None:
            sc.setJobGroup(group, f"keyfill compact: {description}", interruptOnCancel=True)
            sc.setJobDescription(f"keyfill compact: {description}")
            try:
                result.append(action())
            except BaseException as exc:  # handed to the caller's thread
                failure.append(exc)

        thread = threading.Thread(target=work, name=f"keyfill-{description}", daemon=True)
        thread.start()
        try:
            while thread.is_alive():
                thread.join(POLL_S)
                if thread.is_alive() and self.dest.exists(self.key):
                    sc.cancelJobGroup(group)
                    thread.join()
                    break
        except BaseException:  # Ctrl-C: stop the tasks too
            sc.cancelJobGroup(group)
            raise
        error = self.reported()
        if error is not None:
            raise error
        if failure:
            raise failure[0]
        return result[0]


def _error_types() -> dict[str, type[KeyfillError]]:
    """keyfill's error types by name (those imported so far: a task's module is imported in
    the driver too)."""
    found: dict[str, type[KeyfillError]] = {}
    todo: list[type[KeyfillError]] = [KeyfillError]
    while todo:
        t = todo.pop()
        found.setdefault(t.__name__, t)
        todo.extend(t.__subclasses__())
    return found
