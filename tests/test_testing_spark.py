"""keyfill.testing's check of a Spark query, on a real local[2] Spark: a query whose
watermark delay is below the topic's out-of-orderness is caught dropping a record, and
passes with the delay at the bound, across a crash and restart; the kit's archives may live
on S3. (The fraud job of jobs/fraud_backfill.py is checked by docs/testing.md's example,
tests/test_testing_docs.py.)"""

from __future__ import annotations

import dataclasses

import pytest

import reader.spark
from keyfill.testing import (
    BackfillSettings,
    DifferentialError,
    Record,
    TopicArchive,
    check_job,
)
from keyfill.testing.spark import check_spark_query
from tests.connect_client import CONNECT

DELAY_MS = 10_000


@pytest.fixture(scope="module")
def session(spark):
    reader.spark.register(spark)
    return spark


def _counts(delay: str):
    from pyspark.sql import functions as F

    return lambda df: df.withWatermark("timestamp", delay).groupBy(F.window("timestamp", "1 second"), "key").count()


def test_a_query_whose_watermark_delay_is_below_the_bound_is_caught_dropping_a_record(session):
    late_drop_is_caught(session)


@CONNECT
def test_the_check_takes_a_spark_connect_session(connect):
    """The same check from a Spark Connect client, whose sink runs on the server."""
    connect.run(late_drop_is_caught)


def late_drop_is_caught(session) -> None:
    # Slices of 10 s, one per micro-batch. Spark drops a row whose window closed under the
    # watermark of the micro-batch before last: in batch 2 (slice 2), 9 s (partition 0's
    # maximum in slice 0) with a 0 s delay. Partition 1's record at 5 s comes after one at
    # 21 s, so it is in slice 2: 16 s behind in its partition, on time for a 30 s bound, but
    # its one-second window closed at 6 s. The record at 60 s closes the others' windows at the end.
    t0 = 1_767_225_600_000
    archive = TopicArchive(
        "payments",
        (
            (
                Record(0, 0, t0 + 9_000, b"a", b"1"),
                Record(0, 1, t0 + 15_000, b"a", b"2"),
                Record(0, 2, t0 + 60_000, b"c", b"5"),
            ),
            (Record(1, 0, t0 + 21_000, b"b", b"3"), Record(1, 1, t0 + 5_000, b"b", b"4")),
        ),
        10,
    )
    backfill = BackfillSettings(groups=2, slice_duration="10s", watermark_bound_ms=30_000, slices_per_trigger=1)
    with pytest.raises(DifferentialError, match=r"dropped 1 row\(s\) as late"):
        check_spark_query(session, _counts("0 seconds"), archive, backfill, key="key")
    # with the delay at the bound it passes, also when the query crashes after two
    # micro-batches and resumes from its checkpoint
    again = dataclasses.replace(backfill, restarts=(1,))
    result = check_spark_query(session, _counts("30 seconds"), archive, again, key="key")
    assert (result.records, result.late, result.rows, result.restarts) == (5, 0, 4, 1)


def test_the_kit_writes_its_archives_to_s3(session, keyfill_s3_url):
    archive = TopicArchive(
        "events",
        ((Record(0, 0, 1_000, b"a", b"x"), Record(0, 1, 2_000, b"b", b"y"), Record(0, 2, 1_500, b"a", b"z")),),
        10,
    )

    def per_key(stream):
        for r in stream:
            yield r.key, r.value

    backfill = BackfillSettings(groups=2, restarts=(1,), watermark_bound_ms=1_000)
    result = check_job(per_key, archive, backfill, url=keyfill_s3_url)
    assert (result.records, result.keys, result.outputs) == (3, 2, 3)
    from keygroups.storage import open_storage

    assert any("/compacted/groups/" in i.key for i in open_storage(keyfill_s3_url).list(""))


def _logins_before_payments(delay: str):
    """Payments joined with the same user's logins in the 20 s before them, under watermarks."""
    from pyspark.sql import functions as F

    def build(payments, logins):
        p = payments.select(F.col("timestamp").alias("paid_at"), F.col("key").cast("string").alias("user"), "value")
        lg = logins.select(F.col("timestamp").alias("login_at"), F.col("key").cast("string").alias("login_user"))
        p, lg = p.withWatermark("paid_at", delay), lg.withWatermark("login_at", delay)
        on = F.expr("user = login_user AND login_at BETWEEN paid_at - INTERVAL 20 SECONDS AND paid_at")
        return p.join(lg, on).select("user", "paid_at", "login_at", F.col("value").cast("string").alias("payment"))

    return build


def test_a_join_of_two_topics_is_checked_over_two_paced_backfills(session):
    """Several archives: the query takes one DataFrame per topic. Logins start 30 s after the
    payments, at another density, with one login 19 s behind its partition's maximum (on time
    for the 20 s bound); both sources are paced alike, so the join drops nothing and appends
    what the one-batch reference appends, across a crash."""
    t0 = 1_767_225_600_000
    payments = TopicArchive(
        "payments",
        tuple(
            tuple(
                Record(p, i, t0 + 4_000 * i + 700 * p, b"u%d" % ((i + p) % 3), b"pay%d-%d" % (p, i)) for i in range(30)
            )
            for p in range(2)
        ),
        6,
    )
    stamps = [30_000, 39_000, 48_000, 57_000, 66_000, 75_000, 84_000, 93_000, 101_000, 82_000]
    logins = TopicArchive(
        "logins", (tuple(Record(0, i, t0 + s, b"u%d" % (i % 3), b"in") for i, s in enumerate(stamps)),), 4
    )
    backfill = BackfillSettings(
        groups=2, slice_duration="10s", watermark_bound_ms=20_000, slices_per_trigger=1, restarts=(2,)
    )
    result = check_spark_query(session, _logins_before_payments("20 seconds"), [payments, logins], backfill, key="user")
    assert (result.records, result.late, result.restarts) == (70, 0, 1) and result.rows > 20
