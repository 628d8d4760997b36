"""What keyfill asks of Spark's API, on the PySpark of this environment. `make
test-spark-versions` runs this in an environment per supported minor version (3.5, 4.0, 4.1,
4.2, 4.3), keyfill installed without extras beside `pyspark[sql]` (and `[connect]` from 4.0)
as a cluster library is installed:

- the compaction on Spark writes the in-process compaction's archive, byte for byte (the
  assignment by its rows), and its canonical form goes to $KEYFILL_SPARK_VERSIONS_OUT, where
  the run compares every version's (tests/spark_versions/compare.py);
- `plan` on Spark estimates what it estimates in process; verify, in process and on Spark,
  passes;
- `format("keyfill")`, where PySpark has Python data sources (4.0 and later): every record
  once in a batch read, in a processing-time stream of several micro-batches stopped and
  restarted from its checkpoint, and in Trigger.AvailableNow runs to the archive's end at the
  defaults and at a small byte budget (`reader.available_now`: one run on 4.2 and later,
  several before), and the fraud example job drops no record as late; where it has none
  (open-source 3.5), register refuses in one line naming the Spark it needs;
- filter pushdown from 4.1, refused in one line on 4.0;
- from the archive into the live topic on a real broker (tansu), in the fraud example job;
  two archives paced in event time and joined (the join example), none late;
- a Spark Connect session (4.0 and later) compacts the same archive and streams it.

This run's pytest has no hypothesis: keyfill's pytest plugin loads without it (a plain
`pip install keyfill` leaves a user's test runs working)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pickle
import random
import subprocess
import sys
import time
from pathlib import Path

import pyspark
import pytest

import keygroups
import reader.spark.api as spark_api
from tests.spark_versions.conftest import COMPACT, ROOT

CONNECT = spark_api.DATA_SOURCES and importlib.util.find_spec("grpc") is not None  # Spark Connect from 4.0


def digest(canonical: dict) -> str:
    return hashlib.sha256(pickle.dumps(sorted(canonical.items(), key=lambda kv: kv[0]), protocol=4)).hexdigest()


def test_keyfill_is_the_installed_one_and_hypothesis_is_absent():
    assert Path(keygroups.__file__).resolve().parent != ROOT / "keygroups", keygroups.__file__
    assert "site-packages" in Path(keygroups.__file__).parts
    assert importlib.util.find_spec("hypothesis") is None  # the plugin loaded without it: this run started


def test_the_compaction_on_spark_writes_the_in_process_archive(compacted, reference):
    from tests.records import canonical_files

    got = canonical_files(compacted, assignment_rows=True)
    assert sorted(got) == sorted(reference)
    assert [k for k in reference if got[k] != reference[k]] == []
    out = os.environ.get("KEYFILL_SPARK_VERSIONS_OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"classic-{pyspark.__version__}.json"), "w") as f:
            json.dump({"pyspark": pyspark.__version__, "session": "classic", "digest": digest(got)}, f)


def test_verify_in_process_and_on_spark_pass(spark, source, compacted):
    from compactor.sources import open_source
    from compactor.verify import verify
    from compactor.verify.spark import verify_spark
    from keygroups.storage import open_storage

    for report in (
        verify(open_source(source), open_storage(compacted)),
        verify_spark(open_source(source), open_storage(compacted), spark),
    ):
        assert report.ok and report.records > 0, report.to_json()


def test_plan_on_spark_is_the_in_process_plan(spark, source, tmp_path):
    """`keyfill plan`'s estimate, its statistics pass on this Spark and in this process."""
    from compactor.estimate import estimate
    from compactor.execution import for_session
    from compactor.job import CompactConfig, analyse, prepare

    plans = []
    for session in (None, spark):
        prepared = prepare(CompactConfig(source=source, dest=str(tmp_path / "planned"), **COMPACT), dry_run=True)
        plans.append(estimate(prepared, analyse(prepared, for_session(session), {})).to_json())
    assert plans[0] == plans[1] and plans[0]["records"] > 0


def records_of(compacted) -> int:
    from keygroups import compacted as archive
    from keygroups.storage import open_storage

    return int(archive.load_manifest(open_storage(compacted)).totals.records)


def once_each(rows) -> tuple[int, int]:
    """(rows, distinct (partition, offset)) of a DataFrame of the source's rows."""
    return rows.count(), rows.select("partition", "offset").distinct().count()


if not spark_api.DATA_SOURCES:

    def test_the_source_refuses_in_one_line_where_spark_has_no_python_data_sources(spark):
        import reader.spark
        from reader.errors import DataSourceUnavailable

        with pytest.raises(DataSourceUnavailable) as caught:
            reader.spark.register(spark)
        message = str(caught.value)
        assert "\n" not in message and "Spark 4.0 or later" in message and spark.version in message

else:

    def test_a_batch_read_gives_every_record_once(spark, compacted):
        import reader.spark

        reader.spark.register(spark)
        total = records_of(compacted)
        assert once_each(spark.read.format("keyfill").load(compacted)) == (total, total)

    def test_a_processing_time_stream_of_several_batches_restarts_from_its_checkpoint(spark, compacted, tmp_path):
        """maxSlicesPerTrigger=2: micro-batches of two slices, whether Spark admits them
        (4.2 and later) or the source bounds them itself; stopped after two batches and
        restarted, it goes on where the checkpoint is."""
        import reader.spark

        reader.spark.register(spark)
        total = records_of(compacted)
        out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
        stream = spark.readStream.format("keyfill").option("maxSlicesPerTrigger", "2").load(compacted)
        writer = stream.writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
        batches = 0
        for run in range(2):
            query = writer.trigger(processingTime="0 seconds").start()
            if run == 0:
                deadline = time.monotonic() + 600
                while len([p for p in query.recentProgress if p.numInputRows]) < 2 and time.monotonic() < deadline:
                    time.sleep(0.2)
                query.stop()
            else:
                query.processAllAvailable()
                query.stop()
            batches += len([p for p in query.recentProgress if p.numInputRows])
        assert batches > 2
        assert once_each(spark.read.parquet(out)) == (total, total)

    @pytest.mark.parametrize("budget", [None, "64k"])
    def test_available_now_runs_read_the_whole_archive_once(spark, compacted, tmp_path, budget):
        """At the defaults (one batch here) and at a 64 KiB budget: every record once, in one
        run where Spark runs AvailableNow in many batches, else in a run a batch."""
        import reader.spark
        from reader import available_now

        reader.spark.register(spark)
        total = records_of(compacted)
        out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
        stream = spark.readStream.format("keyfill")
        if budget:
            stream = stream.option("maxBytesPerTrigger", budget)
        writer = stream.load(compacted).writeStream.format("parquet").option("path", out)
        queries = available_now.available_now_to_end(spark, writer.option("checkpointLocation", ck))
        read = [p["numInputRows"] for p in available_now.progress(queries)]
        assert sum(read) == total and once_each(spark.read.parquet(out)) == (total, total)
        if budget:
            assert len([n for n in read if n]) > 2  # several micro-batches, never one
            assert len(queries) == (1 if spark_api.ADMISSION_CONTROL else len([n for n in read if n]) + 1)

    def test_the_fraud_example_drops_no_record_as_late(spark, compacted, tmp_path):
        from jobs import fraud_backfill

        args = fraud_backfill.parse_args(
            [compacted, "--out", str(tmp_path / "fraud"), "--max-bytes-per-trigger", "64k"]
        )
        result = fraud_backfill.job(spark, args)
        assert result["dropped_late"] == 0
        assert result["records"] == records_of(compacted) and result["batches"] > 2 and result["windows"] > 0

    def test_the_paced_join_example_drops_no_record_as_late(spark, tmp_path):
        """`jobs/fraud_join.py`: two archives paced in event time alike (a stride a batch in
        each, whether Spark admits it or each source bounds its own), joined with no record late."""
        from compactor.job import CompactConfig, compact
        from jobs import fraud_join
        from keyfill.synth.generate import GeneratorConfig, generate

        payments, logins = str(tmp_path / "payments"), str(tmp_path / "logins")
        topics = dict(records=6_000, keys=100, partitions=2, chunk_records=1_000, rate=50.0)
        generate(GeneratorConfig(out=payments, logins_out=logins, logins_after_ms=60_000, **topics), progress=False)
        dests = []
        for name in (payments, logins):
            dests.append(name + "-compacted")
            compact(CompactConfig(source=name, dest=dests[-1], groups=4, slice_duration="10s", seal_all=True))
        args = fraud_join.parse_args(
            [*dests, "--out", str(tmp_path / "joined"), "--stride", "1 minute", "--within", "30 seconds"]
        )
        result = fraud_join.job(spark, args)
        assert result["payments"] == records_of(dests[0]) and result["logins"] == records_of(dests[1])
        assert result["dropped_late"] == 0 and result["joined"] > 0 and result["batches"] > 1  # paced: several strides

    def test_filter_pushdown_where_pyspark_has_it(spark, compacted):
        """From 4.1 a batch read takes the filters Spark pushes (and reads what a read without
        them filtered by Spark reads); on 4.0 asking for it is refused in one line."""
        import reader.spark
        from reader.errors import DataSourceUnavailable

        if not spark_api.FILTER_PUSHDOWN:
            with pytest.raises(DataSourceUnavailable) as caught:
                reader.spark.register(spark, filter_pushdown=True)
            assert "\n" not in str(caught.value) and "filter" in str(caught.value)
            return
        spark.conf.set(reader.spark.PUSHDOWN_CONF, "true")
        try:
            reader.spark.register(spark, filter_pushdown=True)
            pushed = spark.read.format("keyfill").load(compacted).where("key_group = 1")
            got = [r.offset for r in pushed.select("offset").collect()]
            reader.spark.register(spark)
            everything = spark.read.format("keyfill").load(compacted)
            want = [r.offset for r in everything.where("key_group = 1").select("offset").collect()]
        finally:
            spark.conf.set(reader.spark.PUSHDOWN_CONF, "false")
        assert sorted(got) == sorted(want) and want


LIVE = spark_api.DATA_SOURCES and importlib.util.find_spec("confluent_kafka") is not None

if LIVE:

    def test_the_fraud_example_goes_on_into_the_live_topic(spark, tmp_path):
        """The archive of the first part of a topic, then the topic itself on a real broker
        (tansu), in one query: `jobs/fraud_backfill.py --kafka --until-now`, every record
        once and none late, across the runs Spark before 4.2 needs."""
        from compactor.job import CompactConfig, compact
        from jobs import fraud_backfill
        from keyfill.synth.topic import Record, TopicArchive, write_archive
        from keyfill.testing.kafka_broker import start_broker

        rng = random.Random(3)
        parts = []
        for p in range(2):
            clock, records = 1_700_000_000_000, []
            for o in range(1_500):
                clock += rng.randrange(0, 80)
                user = f"u{rng.randrange(30):02d}"
                value = json.dumps({"user": user, "amount": rng.randrange(100, 9_999) / 100, "merchant": "m1"})
                records.append(Record(p, o, clock - rng.choice([0, 0, 400]), user.encode(), value.encode()))
            parts.append(tuple(records))
        prefix = TopicArchive("payments", tuple(part[: len(part) * 3 // 5] for part in parts), 250)
        dest = str(tmp_path / "compacted")
        source = write_archive(prefix, str(tmp_path / "src"))
        compact(CompactConfig(**source, dest=dest, groups=4, slice_duration="10s"))
        with start_broker() as broker:
            name = f"payments-{os.getpid()}"
            broker.create_topic(name, len(parts))
            producer = broker.producer()
            for r in (r for part in parts for r in part):
                producer.produce(name, key=r.key, value=r.value, partition=r.partition, timestamp=r.timestamp)
            assert producer.flush(30) == 0
            args = fraud_backfill.parse_args(
                [dest, "--out", str(tmp_path / "fraud"), "--kafka", broker.bootstrap, "--topic", name]
                + ["--until-now", "--max-offsets-per-trigger", "1000", "--max-slices-per-trigger", "4"]
            )
            result = fraud_backfill.job(spark, args)
        assert result["records"] == sum(len(part) for part in parts) and result["dropped_late"] == 0
        assert result["windows"] > 0


if CONNECT:
    CONNECT_SCRIPT = """
import json, sys
sys.path.append(sys.argv[5])  # after site-packages: keyfill as installed, the tests' helpers from the checkout
from compactor.job import CompactConfig, compact
from compactor.spark_session import local_spark
from tests.records import canonical_files
from tests.spark_versions.test_on_this_spark import digest
import reader.spark
from reader import available_now

source, dest, out, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
spark = local_spark(remote="local[2]", progress=False)
compact(CompactConfig(source=source, dest=dest, **options), spark)
reader.spark.register(spark)
stream = spark.readStream.format("keyfill").option("maxBytesPerTrigger", "256k").load(dest)
writer = stream.writeStream.format("parquet").option("path", out).option("checkpointLocation", out + "-ck")
queries = available_now.available_now_to_end(spark, writer)
rows = spark.read.parquet(out)
print(json.dumps({
    "digest": digest(canonical_files(dest, assignment_rows=True)),
    "rows": rows.count(),
    "distinct": rows.select("partition", "offset").distinct().count(),
    "runs": len(queries),
}))
spark.stop()
"""

    def test_a_spark_connect_session_compacts_the_same_archive_and_streams_it(source, reference, tmp_path):
        """In a process of its own (PySpark runs one kind of session a process), against a
        Connect server it starts (`remote("local[2]")`)."""
        env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
        paths = [str(tmp_path / "c"), str(tmp_path / "o")]
        done = subprocess.run(
            [sys.executable, "-c", CONNECT_SCRIPT, source, *paths, json.dumps(COMPACT), str(ROOT)],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        got = json.loads(done.stdout.strip().splitlines()[-1])
        assert got["digest"] == digest(reference)
        total = reference["manifest"]["totals"]["records"]
        assert got["rows"] == got["distinct"] == total and got["runs"] >= 1
        out = os.environ.get("KEYFILL_SPARK_VERSIONS_OUT")
        if out:
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, f"connect-{pyspark.__version__}.json"), "w") as f:
                json.dump({"pyspark": pyspark.__version__, "session": "connect", "digest": got["digest"]}, f)
