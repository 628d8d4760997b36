"""The garbage collector of a Spark Python worker, settled at each task.

PySpark's daemon runs a full `gc.collect()` after every task of a reused worker. A keyfill
task's worker holds many objects the collector tracks (numba's compiled kernels and type
system, llvmlite, pyarrow), and walking them after every task was a large share of the
rewrite's Python CPU time (docs/performance.md#spark-python-workers-garbage-collector).
Those objects live as long as the worker, so they go into the permanent generation
(`gc.freeze`), and each later collection walks only what tasks created.
"""

from __future__ import annotations

import gc
import os
import sys

# Objects that survived the daemon's last collection, past which a task freezes them too:
# numba loads a kernel on its first call, after the first task's freeze (thousands of
# objects each). Counted per task (a list of that generation: cheap).
REFREEZE_OBJECTS = 10_000
_frozen = False


def settle() -> None:
    """Called first thing in every Spark task of keyfill's. In a reused Spark worker, the
    first time: collect, then freeze what survives; later, freeze again once more than
    REFREEZE_OBJECTS have survived the daemon's collections since. Elsewhere it does nothing:
    the driver and a compaction run in this process keep collecting what they free, and a
    worker that is not reused is never collected by the daemon."""
    global _frozen
    if "pyspark" not in sys.modules or not os.environ.get("SPARK_REUSE_WORKER"):
        return  # a Spark worker has imported pyspark before it runs a task
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return
    if not _frozen:
        gc.collect()  # garbage is freed now, not frozen with the rest
        gc.freeze()
        _frozen = True
    elif len(gc.get_objects(generation=2)) > REFREEZE_OBJECTS:
        gc.freeze()  # the daemon has just collected: what is left has outlived a task
