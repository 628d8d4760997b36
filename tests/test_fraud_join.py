"""jobs/fraud_join.py in a real Spark session: a streaming join of two paced keyfill sources
(payments, and logins a tenth of their volume starting later, compacted at another slice
length) writes exactly the payments a direct join of the source topics finds, drops no row
as late, and reads the same stride from both sources in every micro-batch."""

from __future__ import annotations

import argparse
import collections
import json

import numpy as np
import pyarrow as pa
from test_reader import source_table

from compactor.job import CompactConfig, compact
from jobs.fraud_join import job
from keyfill.synth.generate import GeneratorConfig, generate
from tests.connect_client import CONNECT
from tests.records import below_handoff

WITHIN_MS = 20_000


def payments_with_a_login(payments: pa.Table, logins: pa.Table) -> collections.Counter:
    """The join computed straight from the topics' records: payments (with a user) whose user
    has a login in the WITHIN_MS before them, as (paid_at ms, user, amount, merchant)."""
    seen: dict[str, np.ndarray] = {}
    for user, at in zip(logins.column("key").to_pylist(), logins.column("timestamp").cast(pa.int64()).to_pylist()):
        seen.setdefault(user.decode(), []).append(at)
    seen = {u: np.sort(np.array(v)) for u, v in seen.items()}
    out: collections.Counter = collections.Counter()
    ts = payments.column("timestamp").cast(pa.int64()).to_pylist()
    for at, value in zip(ts, payments.column("value").to_pylist()):
        p = json.loads(value)
        times = seen.get(p["user"]) if p["user"] is not None else None
        if times is not None:
            i = np.searchsorted(times, at - WITHIN_MS)
            if i < len(times) and times[i] <= at:
                out[(at, p["user"], p["amount"], p["merchant"])] += 1
    return out


def test_the_fraud_join_finds_every_payment_with_a_login_pacing_both_sources(spark, tmp_path):
    fraud_join_finds_every_payment_with_a_login(spark, *topics(str(tmp_path)))


@CONNECT
def test_the_fraud_join_over_spark_connect_finds_every_payment_with_a_login(connect, tmp_path):
    connect.run(fraud_join_finds_every_payment_with_a_login, *topics(str(tmp_path)))


def topics(work: str) -> tuple:
    """Payments and logins, compacted in this process: (the archives, each topic's records
    below its hand-off, a scratch folder)."""
    src, logins_src = f"{work}/payments", f"{work}/logins"
    generate(
        GeneratorConfig(
            out=src,
            records=16_000,
            keys=300,
            partitions=3,
            chunk_records=4_000,
            rate=200.0,
            seed=5,
            logins_out=logins_src,
            logins_after_ms=15_000,
        ),
        progress=False,
    )
    urls = [f"{work}/payments-compacted", f"{work}/logins-compacted"]
    for source, dest, d in zip((src, logins_src), urls, ("5s", "2s")):
        compact(CompactConfig(source=source, dest=dest, groups=3, slice_duration=d))  # in process
    payments, logins = (below_handoff(source_table(s), u) for s, u in zip((src, logins_src), urls))
    return urls, payments, logins, work


def fraud_join_finds_every_payment_with_a_login(spark, urls: list[str], payments, logins, work: str) -> None:
    args = argparse.Namespace(
        payments=urls[0],
        logins=urls[1],
        out=f"{work}/out",
        within=f"{WITHIN_MS // 1000} seconds",
        watermark_delay="5 seconds",
        stride="20 seconds",
        start=None,
        max_slices_per_trigger=None,
        overwrite=True,
    )
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "2")  # the join's state stores: one per partition, per side
    try:
        r = job(spark, args)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", partitions)
    assert (r["payments"], r["logins"]) == (payments.num_rows, logins.num_rows)
    assert r["dropped_late"] == 0
    got = collections.Counter(
        (round(row["paid_at"].timestamp() * 1000), row["user"], row["amount"], row["merchant"])
        for row in spark.read.parquet(r["joined_dir"]).collect()
    )
    want = payments_with_a_login(payments, logins)
    assert len(want) > 1_000
    assert got == want
    moved = []  # per micro-batch, the stride each source that moved read
    for p in r["progress"]:
        offsets = [
            [json.loads(o) if isinstance(o, str) else o for o in (s["startOffset"], s["endOffset"])]
            for s in p["sources"]
        ]
        moved.append({a["stride"] for a, e in offsets if a is not None and a != e})
    assert all(len(m) <= 1 for m in moved)  # a stride read in one batch is the same in both sources
    read = [m.pop() for m in moved if m]
    assert read == list(range(read[0], read[0] + len(read)))  # one stride a batch, none skipped
