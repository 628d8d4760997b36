"""A Spark task of keyfill's freezes its worker's objects once, so the collection PySpark
runs after every task walks only what tasks create; outside a task nothing is frozen."""

from __future__ import annotations

import gc

import pyarrow as pa

from keygroups import worker_gc


def test_a_spark_task_freezes_its_worker_once_and_keeps_collecting(spark):
    def probe(batches):  # defined here: pickled by value, as a job's task is
        import gc

        from keygroups import worker_gc

        worker_gc.settle()
        first = gc.get_freeze_count()
        kept = [[i] for i in range(50_000)]  # objects made after the freeze: a second settle must not freeze them
        worker_gc.settle()
        second = gc.get_freeze_count()
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict(
            {
                "first": [first],
                "second": [second],
                "kept": [len(kept)],
                "enabled": [gc.isenabled()],
            }
        )

    schema = "first long, second long, kept long, enabled boolean"
    rows = [r.asDict() for r in spark.range(0, 8, 1, 4).mapInArrow(probe, schema).collect()]
    assert len(rows) == 4
    for r in rows:
        assert r["first"] > 10_000  # numba, pyarrow and pyspark's objects: tens of thousands at least
        assert r["second"] == r["first"]  # frozen once per process, not per call
        assert r["enabled"]  # the collector still runs, over what tasks create


def test_outside_a_task_nothing_is_frozen():
    before = gc.get_freeze_count()
    worker_gc.settle()
    assert gc.get_freeze_count() == before
    assert not worker_gc._frozen
