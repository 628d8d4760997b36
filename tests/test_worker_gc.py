"""A Spark task of keyfill's freezes its worker's long-lived objects, so the collection
PySpark runs after every task walks only what tasks create; outside a task nothing is frozen."""

from __future__ import annotations

import gc

from keygroups import worker_gc


def test_a_spark_task_freezes_what_outlives_tasks_and_still_collects_the_rest(spark):
    def probe(batches):  # defined here: pickled by value, as a job's task is
        import gc
        import weakref

        import pyarrow as pa

        from keygroups import worker_gc

        worker_gc.settle()
        first = gc.get_freeze_count()
        worker_gc.settle()
        again = gc.get_freeze_count()  # nothing new has outlived a collection: no second freeze
        kept = [[i] for i in range(3 * worker_gc.REFREEZE_OBJECTS)]  # as a kernel numba loads late
        gc.collect()  # what PySpark's daemon runs after a task
        worker_gc.settle()
        grown = gc.get_freeze_count()

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle made after the freeze: only the collector frees it
        alive = weakref.ref(a)
        del a, b
        gc.collect()
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict(
            {
                "first": [first],
                "again": [again],
                "grown": [grown],
                "kept": [len(kept)],
                "cycle_freed": [alive() is None],
            }
        )

    schema = "first long, again long, grown long, kept long, cycle_freed boolean"
    rows = [r.asDict() for r in spark.range(0, 8, 1, 4).mapInArrow(probe, schema).collect()]
    assert len(rows) == 4
    for r in rows:
        assert r["first"] > 10_000  # numba, pyarrow and pyspark's objects: tens of thousands at least
        assert r["again"] == r["first"]
        assert r["grown"] >= r["first"] + r["kept"]  # the late survivors frozen too
        assert r["cycle_freed"]  # the collector still frees what tasks make


def test_outside_a_task_nothing_is_frozen():
    before = gc.get_freeze_count()
    worker_gc.settle()
    assert gc.get_freeze_count() == before
    assert not worker_gc._frozen
