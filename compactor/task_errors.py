"""Errors a Spark task meets in its input or in the archive: reported once, not retried,
and the job stopped.

A truncated chunk, a damaged Kafka segment, a malformed JSON line, an archive file cut short
or missing: each fails the same way on every attempt, yet Spark retries a failed task
(`spark.task.maxFailures`, 4 on a cluster), logs each attempt's executor traceback, and only
then fails the job, with the error buried under them. So a task that meets a deterministic
error (a `KeyfillError` that is not a transient storage error: those get Spark's retries)
does not raise: it records the error and its traceback in the run's error object
(`_runs/<run>.error.json`, created once: the first error wins), and ends cleanly. The driver
runs each Spark action in a job group of its own and looks for that object while it waits;
when it appears, it cancels the group and raises the error as it was raised in the task: one
line naming the object, and where the task's traceback is kept. Spark has no per-exception
retry policy and no channel from a Python task to the driver other than the storage both
already share, which is why this is written here.

The error that stopped the action is the one raised. A store that does not answer fails the
tasks' reads within its bound (`KEYFILL_STORAGE_*`), and their error is the run's: looking
for the error object never replaces it (the look-out runs beside the action, and what it
cannot read it leaves), and a task that cannot record its error within `RECORD_S` raises it
to Spark instead. An action that fails in a task is raised as the task's own `KeyfillError`
(`raised_in_task`), not as Spark's wrapper.
"""

from __future__ import annotations

import json
import re
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

from compactor.errors import TaskInputError
from compactor.lease import best_effort
from keygroups import compacted
from keygroups.errors import InvalidKey, KeyfillError, ObjectExists, ObjectNotFound, StorageError
from keygroups.storage import Storage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T = TypeVar("T")
In = TypeVar("In")
Out = TypeVar("Out")
POLL_S = 1.0  # how often the driver looks for the error object while a job runs


def deterministic(exc: BaseException) -> bool:
    """An error another attempt would meet again: any KeyfillError but a storage error that
    may pass (a timeout, a refused or failed request). A missing object stays missing."""
    if not isinstance(exc, KeyfillError):
        return False
    return not isinstance(exc, StorageError) or isinstance(exc, (ObjectNotFound, InvalidKey))


# The last "module.Type: message" line of keyfill's own packages in a Spark exception, which
# carries the driver's and the executor's tracebacks around it.
_TASK_ERROR = re.compile(r"^(?:keygroups|compactor|keyfill|reader)\.[\w.]*\.([A-Z]\w*): (.+)$", re.M)


def raised_in_task(exc: BaseException) -> KeyfillError | None:
    """The keyfill error a Spark task raised, from the exception Spark wraps it in, as the
    type it was raised as (TaskInputError if that type cannot be built from its message)."""
    found = _TASK_ERROR.findall(str(exc))
    return _as_raised(*found[-1]) if found else None


def _as_raised(kind: str, message: str) -> KeyfillError:
    message = message.strip()
    try:
        return _error_types().get(kind, TaskInputError)(message)
    except TypeError:
        return TaskInputError(message)


class TaskErrors:
    """The error channel of one run: `guard` wraps the tasks, `watch` the driver's actions.
    Pickled into the tasks (a store and a key)."""

    def __init__(self, dest: Storage, run: str) -> None:
        self.dest, self.run_id, self.key = dest, run, compacted.run_error_key(run)

    def report(self, exc: BaseException, trace: str = "") -> str | None:
        """Record `exc` (None), or why it could not be within `RECORD_S`."""
        body = compacted.dumps({"type": type(exc).__name__, "message": str(exc), "traceback": trace})

        def create() -> None:
            try:
                self.dest.create(self.key, body)
            except ObjectExists:
                pass  # another task's error was first: one is enough

        return best_effort(create)

    def guard(self, task: Callable[[Iterator[In]], Iterator[Out]]) -> Callable[[Iterator[In]], Iterator[Out]]:
        """`task` (a mapInArrow or mapPartitions function) that reports a deterministic error
        and stops, instead of raising it (raising it still when it cannot be recorded)."""

        def guard_batches(batches: Iterator[In]) -> Iterator[Out]:
            try:
                yield from task(batches)
            except Exception as exc:
                if not deterministic(exc) or self.report(exc, traceback.format_exc()) is not None:
                    raise

        return guard_batches

    def read_report(self) -> KeyfillError | None:
        """The error a task reported, as the type it was raised as, its message naming where
        the task's traceback is kept. A store that cannot say raises: the action's result
        may lack what that task would have made."""
        try:
            found = json.loads(self.dest.read(self.key))
        except ObjectNotFound:
            return None
        except ValueError:
            found = {}
        message = str(found.get("message", "a Spark task found bad input"))
        if found.get("traceback"):
            message += f"; the task's traceback is in {self.dest.url_for(self.key)}"
        return _as_raised(str(found.get("type")), message)

    def watch(self, spark: SparkSession, description: str, action: Callable[[], T]) -> T:
        """`action()` (a Spark action) in a job group of its own, cancelled as soon as a task
        reports an error, which is then raised here; an action that fails raises its task's
        error (`raised_in_task`)."""
        jobs = _Jobs.of(spark, f"keyfill-{self.run_id}-{threading.get_ident()}-{description}")
        result: list[T] = []
        failure: list[BaseException] = []
        seen = threading.Event()  # the error object appeared: the group is cancelled

        def work() -> None:
            try:
                with jobs.name_jobs(f"keyfill compact: {description}"):
                    result.append(action())
            except BaseException as exc:  # handed to the caller's thread
                failure.append(exc)

        def watch() -> None:
            while not stopped.wait(POLL_S):
                try:
                    found = self.dest.exists(self.key)
                except StorageError:
                    continue  # the tasks meet the same store: their error is the run's
                if found and not stopped.is_set():
                    seen.set()
                    jobs.cancel()
                    return

        thread = threading.Thread(target=work, name=f"keyfill-{description}", daemon=True)
        stopped = threading.Event()
        thread.start()
        threading.Thread(target=watch, name=f"keyfill-{description}-errors", daemon=True).start()
        try:
            while thread.is_alive():
                thread.join(POLL_S)
        except BaseException:  # Ctrl-C: stop the tasks too
            jobs.cancel()
            raise
        finally:
            stopped.set()
        if failure and not seen.is_set():
            _raise_failed(failure[0])
        error = self.read_report()
        if error is not None:
            raise error
        if failure:
            _raise_failed(failure[0])
        return result[0]


class _Jobs:
    """The jobs one thread's actions start, named and cancelled together: a job group on a
    classic session (its SparkContext), an operation tag on a Connect session, which has no
    job groups (a tag is the thread's, as a job group is; `interruptTag` cancels what carries
    it). A classic session's tags do not reach the jobs PySpark's Arrow collection starts
    (pyspark 4.3: `interruptTag` found none), hence one class per kind."""

    def __init__(self, spark: SparkSession, group: str) -> None:
        self.spark, self.group = spark, group

    @staticmethod
    def of(spark: SparkSession, group: str) -> _Jobs:
        from keygroups.spark_kind import is_connect

        return _Tagged(spark, group) if is_connect(spark) else _Jobs(spark, group)

    @contextmanager
    def name_jobs(self, description: str) -> Iterator[None]:
        """Jobs this thread starts meanwhile are the group's, shown as `description`."""
        sc = self.spark.sparkContext
        sc.setJobGroup(self.group, description, interruptOnCancel=True)
        sc.setJobDescription(description)
        yield

    def cancel(self) -> None:
        self.spark.sparkContext.cancelJobGroup(self.group)


class _Tagged(_Jobs):
    def __init__(self, spark: SparkSession, group: str) -> None:
        super().__init__(spark, group.replace(",", ";"))  # a tag holds no comma

    @contextmanager
    def name_jobs(self, description: str) -> Iterator[None]:
        self.spark.addTag(self.group)
        try:
            yield
        finally:
            self.spark.removeTag(self.group)

    def cancel(self) -> None:
        self.spark.interruptTag(self.group)


def _raise_failed(exc: BaseException) -> None:
    """A failed action's error: its task's KeyfillError where it raised one (Spark's own
    exception, with both tracebacks, as its cause)."""
    error = raised_in_task(exc)
    if error is None:
        raise exc
    raise error from exc


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
