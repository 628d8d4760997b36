"""Where the compaction's and the audit's tasks run: on Spark, or in this process
(`compactor.job.compact` with no session: small inputs and tests; `compactor.verify.verify`).
The phases and the audit are written once over `Execution`, so both backends run the same
task functions and write the same bytes (report the same findings); what only Spark needs
(the error channel, the worker's garbage collector, job names, persisting, the Arrow batch
size) stays here.

Rows a backend hands between its operations are opaque to the phases: a Spark DataFrame, or
an Arrow table in this process (`Execution[Rows]`; the phases are generic in `Rows`, so they
can only hand the rows back to the backend)."""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from compactor.errors import ConnectRequestTooLarge, TaskCodeMismatch
from compactor.group_partitioning import group_slots
from compactor.lease import best_effort
from compactor.shuffle_codec import CODEC
from compactor.task_errors import TaskErrors
from keygroups import compacted, spark_kind, worker_gc
from keygroups.executor_code import ship_to_executors
from keygroups.storage import Storage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

Task = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
T = TypeVar("T")
R = TypeVar("R")
Rows = TypeVar("Rows")  # what a backend's operations hand each other: a DataFrame, an Arrow table


class Execution(Protocol[Rows]):
    @property
    def codec(self) -> str | None:
        """How a shuffle's values are packed (`compactor.shuffle_codec`)."""

    @property
    def parallelism(self) -> int:
        """Tasks that run at once."""

    @property
    def shares_environment(self) -> bool:
        """Tasks run in this process's environment (its credentials, its disk)."""

    def slots(self, partitions: int) -> npt.NDArray[np.int64]:
        """slots[p]: a `slot` value the shuffle sends to partition p."""

    def map(self, inputs: pa.Table, task: Task, schema: pa.Schema) -> Rows:
        """`task` over the input rows (a task per few rows), yielding `schema`'s rows."""

    def where(self, rows: Rows, column: str, values: Sequence[int], columns: Sequence[str]) -> Rows:
        """The rows whose `column` is one of `values`, with `columns` only."""

    def collect(self, name: str, rows: Rows) -> pa.Table:
        """The rows, in an action (a job) called `name`."""

    def shuffle(
        self,
        name: str,
        rows: Rows,
        partitions: int,
        task: Task,
        schema: pa.Schema,
        sort: Sequence[str] = (),
        batch_bytes: int | None = None,
    ) -> pa.Table:
        """`task` over `partitions` partitions, each holding the rows whose `slot` is its
        entry of `slots(partitions)`, sorted by `sort`; its rows collected. `name`: the
        action's job; `batch_bytes`: what a task is handed at once at most."""

    def scan(self, name: str, rows: Rows, key: str, order: Sequence[str], task: Task, schema: pa.Schema) -> pa.Table:
        """`task` over the rows, every row of one `key` value handed to the same task, and
        each task's rows in (`key`, *`order`) order, in batches of any size: a running
        computation along each key's rows (two sides merged, a running maximum) that holds
        one batch at a time. Its rows collected, in an action called `name`."""

    def each(self, name: str, task: Callable[[T], R], items: list[T]) -> list[R]:
        """`task` of every item, a task per item."""

    def persist(self, rows: Rows, serialized: bool = False) -> AbstractContextManager[Rows]:
        """A context in which `rows` are computed once for several actions."""

    def close(self) -> None:
        """Delete what the run's tasks were handed through its store (OnSpark on Connect)."""


def for_session(
    spark: SparkSession | None = None, errors: TaskErrors | None = None, description: str | None = None
) -> Execution[pa.Table] | Execution[DataFrame]:
    """Spark's, or with no session this process's. `description`: `OnSpark`'s."""
    return InProcess() if spark is None else OnSpark(spark, errors, description)


class InProcess:
    """Every task in this process, with every row in memory: a shuffle or a scan has one
    partition. A task's error is raised where it happens. A `map`'s tasks run one after
    another, or with `threads`, a task per input row on that many threads (tasks that wait
    on a store's reads), their rows in input order; the first error ends the map without
    starting the tasks still queued, each of which might wait as long (a frozen store).
    `progress`: a progress bar of each map's tasks, with this description."""

    codec = None
    shares_environment = True

    def __init__(self, threads: int = 1, progress: str | None = None) -> None:
        self.parallelism = self.threads = threads
        self.progress = progress

    def slots(self, partitions: int) -> npt.NDArray[np.int64]:
        return np.zeros(partitions, np.int64)

    def map(self, inputs: pa.Table, task: Task, schema: pa.Schema) -> pa.Table:
        if self.threads == 1 and self.progress is None:
            return pa.Table.from_batches(task(iter(inputs.to_batches())), schema)
        from tqdm import tqdm

        def one(row: int) -> list[pa.RecordBatch]:
            return list(task(iter(inputs.slice(row, 1).to_batches())))

        pool = ThreadPoolExecutor(max_workers=self.threads)
        try:
            done = tqdm(
                pool.map(one, range(inputs.num_rows)),
                total=inputs.num_rows,
                desc=self.progress,
                unit="task",
                disable=self.progress is None,
            )
            return pa.Table.from_batches([b for batches in done for b in batches], schema)
        finally:
            pool.shutdown(cancel_futures=True)

    def where(self, rows: pa.Table, column: str, values: Sequence[int], columns: Sequence[str]) -> pa.Table:
        kept = rows.select(list(dict.fromkeys([*columns, column])))  # the filter copies only what is kept
        return kept.filter(pc.is_in(kept.column(column), pa.array(values, kept.schema.field(column).type))).select(
            columns
        )

    def collect(self, name: str, rows: pa.Table) -> pa.Table:
        return rows

    def shuffle(
        self,
        name: str,
        rows: pa.Table,
        partitions: int,
        task: Task,
        schema: pa.Schema,
        sort: Sequence[str] = (),
        batch_bytes: int | None = None,
    ) -> pa.Table:
        """The rows handed to one task in the order a Spark task sorts its own (one row a
        batch when sorted: views, not copies)."""
        batches = [b for b in rows.to_batches() if b.num_rows]
        if sort and batches:
            at = [(b, i) for b in batches for i in range(b.num_rows)]
            keys = [np.concatenate([b.column(k).to_numpy() for b in batches]) for k in reversed(sort)]
            batches = [at[i][0].slice(at[i][1], 1) for i in np.lexsort(keys).tolist()]
        return pa.Table.from_batches(task(iter(batches)), schema)

    def scan(
        self, name: str, rows: pa.Table, key: str, order: Sequence[str], task: Task, schema: pa.Schema
    ) -> pa.Table:
        """The rows sorted, handed over `SCAN_BATCH_ROWS` at a time: the sorted copy is
        made a batch at a time."""
        at = pc.sort_indices(rows, sort_keys=[(c, "ascending") for c in (key, *order)])
        steps = range(0, len(at), SCAN_BATCH_ROWS)
        batches = (b for i in steps for b in rows.take(at[i : i + SCAN_BATCH_ROWS]).to_batches())
        return pa.Table.from_batches(task(batches), schema)

    def each(self, name: str, task: Callable[[T], R], items: list[T]) -> list[R]:
        return [task(item) for item in items]

    @contextmanager
    def persist(self, rows: pa.Table, serialized: bool = False) -> Iterator[pa.Table]:
        yield rows

    def close(self) -> None:
        pass


class OnSpark:
    """Tasks on Spark, a classic session or a Spark Connect one alike: only the DataFrame
    API (`keygroups.spark_kind` answers what the two kinds ask differently). Each task
    settles its worker's garbage collector first and, with `errors`, reports a bad input
    once instead of failing (`compactor.task_errors`); each action runs in a job named after
    it. `description`: the session's job description for the rest (a classic session's:
    a Connect session's jobs carry their action's tag instead)."""

    codec = CODEC

    def __init__(self, spark: SparkSession, errors: TaskErrors | None = None, description: str | None = None) -> None:
        self.spark, self.errors = spark, errors
        self.stored: list[str] = []  # task functions handed through the run's store
        ship_to_executors(spark)
        self.parallelism = spark_kind.cores(spark)
        self.shares_environment = spark_kind.shares_environment(spark)
        if description is not None and not spark_kind.is_connect(spark):
            spark.sparkContext.setJobDescription(description)

    def slots(self, partitions: int) -> npt.NDArray[np.int64]:
        return group_slots(self.spark, partitions)

    def map(self, inputs: pa.Table, task: Task, schema: pa.Schema) -> DataFrame:
        """The input rows travel in the task's closure, and a range of their indexes is what
        Spark splits: a few rows a task, consecutive ones together, with no RDD (a Connect
        session has none) and no shuffle."""
        parallel = max(1, min(inputs.num_rows, self.parallelism * 4))
        indexes = self.spark.range(0, inputs.num_rows, 1, parallel)
        return indexes.mapInArrow(self._task(_rows_of(inputs.combine_chunks(), task)), spark_ddl(schema))

    def where(self, rows: DataFrame, column: str, values: Sequence[int], columns: Sequence[str]) -> DataFrame:
        from pyspark.sql import functions as F

        return rows.filter(F.col(column).isin([int(v) for v in values])).select(*columns)

    def collect(self, name: str, rows: DataFrame) -> pa.Table:
        return self._action(name, lambda: spark_kind.to_arrow(rows))

    def shuffle(
        self,
        name: str,
        rows: DataFrame,
        partitions: int,
        task: Task,
        schema: pa.Schema,
        sort: Sequence[str] = (),
        batch_bytes: int | None = None,
    ) -> pa.Table:
        frame = rows.repartition(partitions, "slot")
        if sort:
            frame = frame.sortWithinPartitions(*sort)
        mapped = frame.mapInArrow(self._task(task), spark_ddl(schema))
        with nullcontext() if batch_bytes is None else _arrow_batches_of(self.spark, batch_bytes):
            return self._action(name, lambda: spark_kind.to_arrow(mapped))

    def scan(
        self, name: str, rows: DataFrame, key: str, order: Sequence[str], task: Task, schema: pa.Schema
    ) -> pa.Table:
        """The rows hashed by `key` into the session's shuffle partitions
        (`spark.sql.shuffle.partitions`), sorted in each (spilling to disk as Spark sorts)."""
        frame = rows.repartition(key).sortWithinPartitions(key, *order)
        mapped = frame.mapInArrow(self._task(task), spark_ddl(schema))
        return self._action(name, lambda: spark_kind.to_arrow(mapped))

    def each(self, name: str, task: Callable[[T], R], items: list[T]) -> list[R]:
        """Items and results pickled: they cross as a binary column, a task per item."""
        if not items:
            return []

        def results(indexes: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for b in indexes:
                done = [pickle.dumps(task(items[i])) for i in b.column(0).to_pylist()]
                yield pa.RecordBatch.from_arrays([b.column(0), pa.array(done, pa.binary())], ["item", "result"])

        frame = self.spark.range(0, len(items), 1, len(items)).mapInArrow(self._task(results), _EACH_ROWS)
        got = self._action(name, lambda: spark_kind.to_arrow(frame))
        by_item = dict(zip(got.column("item").to_pylist(), got.column("result").to_pylist()))
        return [pickle.loads(by_item[i]) for i in range(len(items))]

    @contextmanager
    def persist(self, rows: DataFrame, serialized: bool = False) -> Iterator[DataFrame]:
        from pyspark import StorageLevel

        kept = rows.persist(StorageLevel.MEMORY_AND_DISK) if serialized else rows.persist()
        try:
            yield kept
        finally:
            kept.unpersist()

    def close(self) -> None:
        errors, stored = self.errors, self.stored
        if errors is not None and stored:
            best_effort(lambda: errors.dest.delete_many(stored))
        self.stored = []

    def _task(self, task: Task) -> Task:
        def settle_first(items: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            worker_gc.settle()
            yield from task(items)

        with_guard = settle_first if self.errors is None else self.errors.guard(settle_first)
        return self._fit_for_connect(with_guard) if spark_kind.is_connect(self.spark) else with_guard

    def _fit_for_connect(self, task: Task) -> Task:
        """`task`, or when its pickled function (closure and all: a source's chunk list,
        ~130 bytes a chunk) is larger than a Spark Connect request should carry, a stand-in
        that loads it from the run's store. A Connect plan travels in one gRPC message, which
        the server refuses past `spark.connect.grpc.maxInboundMessageSize` (128 MiB by
        default; the client then retries for minutes), where a classic session broadcasts a
        large function."""
        from pyspark import cloudpickle

        # pyspark's vendored cloudpickle is unannotated.
        body: bytes = cloudpickle.dumps(task)
        if len(body) <= CARRIED_BYTES:
            return task
        if self.errors is None:
            raise ConnectRequestTooLarge(
                f"a Spark task's function holds {len(body) / 2**20:,.0f} MiB (the source's chunk list), more than "
                f"a Spark Connect request carries here ({CARRIED_BYTES >> 20} MiB): run this on a classic session "
                "(spark-submit, or --master), or without --spark"
            )
        digest = hashlib.sha256(body).hexdigest()
        key = compacted.run_task_key(self.errors.run_id, digest[:16])
        self.errors.dest.write(key, body)
        self.stored.append(key)
        return self.errors.guard(_stored_task(self.errors.dest, key, digest))

    def _action(self, name: str, action: Callable[[], T]) -> T:
        return action() if self.errors is None else self.errors.watch(self.spark, name, action)


_EACH_ROWS = "item long, result binary"
SCAN_BATCH_ROWS = 1 << 16  # rows an in-process scan hands its task at once
# A task's pickled function past this size travels through the run's store on Spark Connect
# (`OnSpark._fit_for_connect`): a plan holds several, and a gRPC message is 128 MiB at most.
CARRIED_BYTES = 8 << 20
_loaded: dict[tuple[str, str], Task] = {}  # in a worker: the functions it read


def load_task(store: Storage, key: str, sha256: str) -> Task:
    """The task function at `key`, read once per Python worker (a reused worker keeps it),
    loaded only when its bytes are those the driver wrote: unpickling runs code, and who
    may write to an archive's bucket is often a wider group than who may run code on the
    cluster. The digest travels in the task's closure, inside Spark's own plan."""
    if (key, sha256) not in _loaded:
        from pyspark import cloudpickle

        body = store.read(key)
        found = hashlib.sha256(body).hexdigest()
        if found != sha256:
            raise TaskCodeMismatch(
                f"{store.url_for(key)}: this run's task code was replaced or damaged in the store "
                f"(SHA-256 {found[:16]}…, written as {sha256[:16]}…); it was not loaded"
            )
        _loaded.clear()  # one run's functions at a time: a worker may serve many runs
        _loaded[key, sha256] = cloudpickle.loads(body)
    return _loaded[key, sha256]


def _stored_task(store: Storage, key: str, sha256: str) -> Task:
    def task(items: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return load_task(store, key, sha256)(items)

    return task


def _rows_of(inputs: pa.Table, task: Task) -> Task:
    """`task` over the rows of `inputs` whose indexes a Spark task is handed."""

    def over(indexes: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return task(b for i in indexes for b in inputs.take(i.column(0)).to_batches())

    return over


def spark_ddl(schema: pa.Schema) -> str:
    """The Spark DDL of a flat Arrow schema: what a mapInArrow task declares it yields."""
    names = {pa.int32(): "int", pa.int64(): "long", pa.string(): "string", pa.binary(): "binary"}
    return ", ".join(f"`{f.name}` {names[f.type]}" for f in schema)


_MAX_BATCH_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"


@contextmanager
def _arrow_batches_of(spark: SparkSession, size: int) -> Iterator[None]:
    """The session's Arrow batch byte limit lowered to `size` while an action runs (a
    session setting: other queries of the session running meanwhile see it too)."""
    before = spark.conf.get(_MAX_BATCH_BYTES, None)
    spark.conf.set(_MAX_BATCH_BYTES, str(size))
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(_MAX_BATCH_BYTES)
        else:
            spark.conf.set(_MAX_BATCH_BYTES, before)


if TYPE_CHECKING:  # mypy checks that each backend is an `Execution`, of the rows it hands around
    _in_process: type[Execution[pa.Table]] = InProcess
    _on_spark: type[Execution[DataFrame]] = OnSpark
