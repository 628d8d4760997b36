"""One rewrite task per key group.

`repartition(groups, "grp")` hashes the group ids (Murmur3, seed 42, then pmod), so groups
collide (64 groups land in 37 tasks), and the stage that writes takes as long as its
heaviest task, well above the heaviest group that the packing balanced (measured:
docs/packing.md#from-the-packing-to-the-tasks). Spark's
hash partitioner cannot be replaced from Python, so each group gets a *slot*: a long whose
hash lands in partition g. The rewrite shuffles on the slot, and task g receives group g
alone. The slots are found by Spark itself (its `hash` function is the partitioner's
hash), so they stay right whatever Spark's implementation.

Spark starts a stage's tasks in partition order, so the slots also say which group is
written first: the heaviest (`heaviest_first`). Keys are never split, so a group is at
least as heavy as its heaviest key (a Zipf topic's top key made one group 8x the mean in
`bench_peer`), and such a group started last runs alone while the other cores idle; started
first it overlaps the rest (longest-processing-time-first list scheduling).

Groups are never split across tasks: a group's segment files are cut at slice boundaries
by one writer, which keeps the file-count bound (one file per target size of a group's
bytes, plus its last). With more cores than groups, raise --groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_found: dict[int, npt.NDArray[np.int64]] = {}  # by partition count: Spark's hash does not change within a process


def group_slots(spark: SparkSession, groups: int) -> npt.NDArray[np.int64]:
    """slots[g]: the smallest non-negative long that `repartition(groups, slot)` sends to
    partition g."""
    if groups in _found:
        return np.copy(_found[groups])
    n = 64 * groups  # enough for every residue with overwhelming probability; widened if not
    while True:
        rows = (
            spark.range(0, n).selectExpr(f"pmod(hash(id), {groups}) AS part", "id").groupBy("part").min("id").collect()
        )
        if len(rows) == groups:
            break
        n *= 4
    slots = np.zeros(groups, np.int64)
    for part, slot in rows:
        slots[part] = slot
    _found[groups] = slots
    return np.copy(slots)


def heaviest_first(slots: npt.NDArray[np.int64], weights: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Each group's slot, from `slots[p]`, the slot of partition p (as `group_slots` gives
    them), and `weights[g]`, group g's bytes: the heaviest group gets partition 0's slot,
    the next partition 1's, and so on (ties by group id)."""
    order = np.lexsort((np.arange(len(weights)), -np.asarray(weights, np.int64)))
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return np.asarray(slots)[rank]
