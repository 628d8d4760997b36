"""One rewrite task per group (compactor.group_partitioning): shuffled on its slot as the
rewrite shuffles, every group lands alone in the task of its own number, at the group
counts from 1 to 4,096 — where hashing the group ids put 64 groups in 37 tasks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.group_partitioning import group_slots, heaviest_first


@pytest.mark.parametrize("groups", [1, 2, 3, 16, 64, 1000, 1024])
def test_each_group_lands_alone_in_its_own_task(spark, groups):
    from pyspark.sql import functions as F

    slots = group_slots(spark, groups)
    frame = spark.createDataFrame([(g, int(s)) for g, s in enumerate(slots.tolist())], "grp int, slot long")
    placed = (
        frame.repartition(groups, "slot")
        .select(F.spark_partition_id().alias("task"), "grp")
        .groupBy("task")
        .agg(F.count("*").alias("n"), F.min("grp").alias("grp"))
        .collect()
    )
    assert len(placed) == groups
    assert all(r["n"] == 1 and r["task"] == r["grp"] for r in placed)
    if groups == 64:  # what the slots replace: the group ids hashed share tasks
        hashed = frame.repartition(groups, "grp").select(F.spark_partition_id().alias("task")).distinct().count()
        assert hashed < groups


def test_slots_for_thousands_of_groups_hash_each_to_its_own_partition(spark):
    """Past the counts above, the partitioner's rule (`pmod(hash(slot), groups)`, which they
    prove `repartition` follows) without a stage of 4,096 tasks."""
    groups = 4096
    slots = group_slots(spark, groups)
    frame = spark.createDataFrame([(g, int(s)) for g, s in enumerate(slots.tolist())], "grp int, slot long")
    wrong = frame.where(f"pmod(hash(slot), {groups}) != grp").count()
    assert wrong == 0 and len(set(slots.tolist())) == groups


@given(st.lists(st.integers(0, 1 << 40), min_size=1, max_size=300))
@settings(max_examples=300, deadline=None)
def test_the_heaviest_group_gets_the_first_partition(weights):
    """`heaviest_first`: Spark starts partition 0's task first, so the slots of partitions
    0, 1, ... go to the groups by weight, heaviest first (ties: the lower group id), and every
    partition still holds exactly one group."""
    base = np.arange(100, 100 + len(weights), dtype=np.int64)  # partition p's slot: 100 + p
    slots = heaviest_first(base, np.array(weights, np.int64))
    assert sorted(slots.tolist()) == base.tolist()  # a permutation: one group per partition
    partition_of = slots - 100
    by_partition = sorted(range(len(weights)), key=lambda g: partition_of[g])
    assert by_partition == sorted(range(len(weights)), key=lambda g: (-weights[g], g))
