"""The garbage collector of a Spark Python worker, settled once per process.

PySpark's daemon runs a full `gc.collect()` after every task of a reused worker. A keyfill
task's worker holds ~143K objects the collector tracks (numba's compiled kernels and type
system, llvmlite, pyarrow), and walking them took 50-70 ms per task: with 64 write tasks, 5
of the 11 CPU-seconds the rewrite's Python workers spent on 6M records (perf: gc_collect_main
was the worker's first symbol). Those objects live as long as the worker, so the first task
moves them into the permanent generation (`gc.freeze`), and each later collection walks only
what tasks created since.
"""

from __future__ import annotations

import gc

_frozen = False


def settle() -> None:
    """In a Spark task: collect once, then freeze what survives; a no-op after the first
    call in a process. Called first thing in every Spark task of keyfill's. Outside a task
    (the driver, a compaction run in this process) it does nothing: there no daemon collects
    after each task, and a long-lived process should keep collecting what it frees."""
    global _frozen
    if _frozen:
        return
    try:
        from pyspark import TaskContext
    except ImportError:  # keyfill without Spark: never in a task
        return
    if TaskContext.get() is None:
        return
    gc.collect()  # garbage is freed now, not frozen with the rest
    gc.freeze()
    _frozen = True
