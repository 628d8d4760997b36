"""Invariant 6 where it can break: the same source and options give the same archive bytes
(`tests/records.py::canonical_files`: assignment, segment files, index rows, manifest)
whoever runs the compaction. The reference is the in-process compactor (`spark=None`);
against it: Spark `local[2]` (the session's) with other `spark.sql.shuffle.partitions` and
with the source's chunks handed over in another order than the listing's (the seam:
`Prepared.chunks`; the listing itself is sorted), `local[1]` in a process of its own under
another `PYTHONHASHSEED` (its driver's and, through Spark, its Python workers'), and the
in-process compactor under that seed and given the chunks shuffled. (`local-cluster`, two
executor JVMs: tests/test_cluster.py compares its spark-submit compaction with the
in-process bytes.)

The hand-made source is made for ties: timestamps in whole seconds with many records at
their partition's running maximum, in every partition at once (so a group's piece order must
break ties between partitions and chunks, whatever order the records come in), keys of
equal sizes and counts (so the packing meets equal weights), and chunk files written in an
order unlike their names'. One case has every key exact and files cut small; the other
heavy keys exact and the rest in hash buckets. Drawn archives (test_compactor's) compare
`local[2]` with the in-process compactor too, each with its own shuffle partitions and chunk
orders."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactor.job import CompactConfig, compact, prepare
from compactor.sources.envelope import write_chunk
from keygroups import envelope
from keygroups.storage import open_storage
from tests.connect_client import CONNECT
from tests.records import canonical_files, envelope_records
from tests.test_compactor import small_archive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = {
    "exact": dict(groups=4, slice_duration="10s", target_file_bytes=4096, block_bytes=1024),
    "bucketed": dict(groups=3, slice_duration="5s", exact_keys=2, seal_all=True),
}
CHUNKS = 15  # of the hand-made source
SHUFFLED = random.Random(5).sample(range(CHUNKS), CHUNKS)  # the chunk order handed to a compaction that must not care


def write_source(url: str) -> None:
    """Three partitions of five chunks each, written in shuffled order."""
    rng = random.Random(11)
    keys = [None, b"hot", b"hot", b"hot", *(b"k%02d" % i for i in range(30))]
    batches = []
    for p in range(3):
        offset, clock = 0, 1_700_000_000_000
        for _ in range(CHUNKS // 3):
            n = rng.randrange(40, 110)
            records = []
            for o in range(offset, offset + n):
                clock += rng.choice([0, 0, 1_000])
                records.append(
                    {
                        "partition": p,
                        "offset": o,
                        "timestamp": clock - rng.choice([0, 0, 1_000, 3_000]),  # at or behind the running maximum
                        "key": rng.choice(keys),
                        "value": b"value-%03d-padding-to-32-bytes" % rng.randrange(1000),  # a key weighs its count
                        "headers": [{"key": "h", "value": b"%d" % (o % 3)}] if o % 4 == 0 else [],
                    }
                )
            batches.append(envelope.batch_from_records(records))
            offset += n
    rng.shuffle(batches)
    store = open_storage(url)
    for batch in batches:
        write_chunk(store, batch, "t", codec="null")


def compact_as(spark, source: str, dest: str, options: dict, order: list[int] | None = None) -> None:
    """One compaction; with `order`, the source's chunks handed to it in that order of the
    listing's (`Prepared.chunks`, what the statistics and rewrite passes read)."""
    cfg = CompactConfig(source=source, dest=dest, **options)
    prepared = prepare(cfg)
    if order is not None:
        assert sorted(order) == list(range(len(prepared.chunks)))
        prepared.chunks = [prepared.chunks[i] for i in order]
    compact(cfg, spark, prepared)


def differing(dests: dict[str, str], reference: dict) -> dict[str, list[str]]:
    """For each named archive that differs from `reference` (its canonical files), the
    entries that differ (missing on either side included)."""
    out = {}
    for name, dest in dests.items():
        got = canonical_files(dest)
        diff = sorted(k for k in got.keys() | reference.keys() if got.get(k) != reference.get(k))
        if diff:
            out[name] = diff
    return out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The hand-made source, and the in-process compaction of each case: (source url, case ->
    canonical files)."""
    root = tmp_path_factory.mktemp("determinism")
    source = str(root / "src")
    write_source(source)
    assert SHUFFLED != sorted(SHUFFLED)
    reference = {}
    for case, options in CASES.items():
        dest = str(root / f"reference-{case}")
        compact_as(None, source, dest, options)
        reference[case] = canonical_files(dest)
    files = [k for k in reference["exact"] if k.startswith("groups/")]
    assert len(files) > CASES["exact"]["groups"]  # groups cut into several files
    return source, reference


RUNS = ("local[2]", "local[2], 3 shuffle partitions, chunks shuffled", "in process, chunks shuffled")


def test_local2_with_other_shuffle_partitions_and_chunk_order_writes_the_in_process_bytes(spark, inputs, tmp_path):
    """The session's `local[2]` with spark.sql.shuffle.partitions 16 (a session's default in
    `compactor.spark_session`), then 3 shuffle partitions with the chunks handed over
    shuffled; and the in-process compactor given them shuffled."""
    source, reference = inputs
    before = spark.conf.get("spark.sql.shuffle.partitions")
    for case, options in CASES.items():
        dests = {name: str(tmp_path / f"{case}-{n}") for n, name in enumerate(RUNS)}
        try:
            spark.conf.set("spark.sql.shuffle.partitions", "16")
            compact_as(spark, source, dests["local[2]"], options)
            spark.conf.set("spark.sql.shuffle.partitions", "3")
            compact_as(spark, source, dests["local[2], 3 shuffle partitions, chunks shuffled"], options, SHUFFLED)
        finally:
            spark.conf.set("spark.sql.shuffle.partitions", before)
        compact_as(None, source, dests["in process, chunks shuffled"], options, SHUFFLED)
        diff = differing(dests, reference[case])
        assert not diff, f"{case}: archives that differ from the in-process compaction, and where: {diff}"


# master: spark.sql.shuffle.partitions (local-cluster's executors apart: tests/test_cluster.py
# compares its spark-submit compaction with the in-process bytes)
SESSIONS = {"local[1]": 1}


def compact_in_this_process(spec: dict) -> dict:
    """Run in a process of its own (`python -c`, `spec` as JSON): each case compacted in
    process, then on a Spark session of each master in turn (one after the other in this
    process's JVM); the hash seed's effect here and what each session was, for the test to
    check."""
    from compactor.spark_session import local_spark

    for case, dest in spec["in_process"].items():
        compact_as(None, spec["source"], dest, CASES[case])
    facts = {"hash": hash("keyfill")}
    # The JVMs of those sessions live a minute: the flags tests/conftest.py gives every test
    # driver (SPARK_SUBMIT_OPTS, inherited) halve the CPU their start-up and first jobs take.
    flags = os.environ.get("SPARK_SUBMIT_OPTS", "")
    jvm = {f"spark.{who}.extraJavaOptions": flags for who in ("driver", "executor")}
    for master, dests in spec["spark"].items():
        spark = local_spark(master, app="keyfill-determinism", driver_memory="1g", progress=False, conf=jvm)
        try:
            spark.sparkContext.setLogLevel("ERROR")
            spark.conf.set("spark.sql.shuffle.partitions", str(SESSIONS[master]))
            for case, dest in dests.items():
                compact_as(spark, spec["source"], dest, CASES[case])
            sc = spark.sparkContext
            facts[master] = {
                "master": sc.master,
                "worker_hash": sc.parallelize([0], 1).map(lambda _: hash("keyfill")).collect()[0],
                "parallelism": sc.defaultParallelism,
                "executors": sc._jsc.sc().getExecutorMemoryStatus().size() - 1,  # without the driver
                "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
            }
        finally:
            spark.stop()
    return facts


@pytest.mark.spark  # local[1] in a subprocess
def test_local1_under_another_hash_seed_writes_the_in_process_bytes(inputs, tmp_path):
    """In a process under another PYTHONHASHSEED than this one's: the in-process compactor,
    then `local[1]` with one shuffle partition."""
    source, reference = inputs
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    spec = {
        "source": source,
        "in_process": {case: str(tmp_path / f"in-process-{case}") for case in CASES},
        "spark": {m: {case: str(tmp_path / f"{m}-{case}") for case in CASES} for m in SESSIONS},
    }
    code = (
        "import json, sys; from tests.test_determinism import compact_in_this_process;"
        "print(json.dumps(compact_in_this_process(json.loads(sys.argv[1]))))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME")}
    env |= {"PYTHONHASHSEED": seed, "PYTHONPATH": ROOT, "SPARK_LOCAL_IP": "127.0.0.1"}
    env |= {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["hash"] != hash("keyfill")  # the seed differs from this process's, and hashes differently
    for master, want in {"local[1]": (1, 0)}.items():
        got = facts[master]
        # what the session was: its workers under the seed, the cores, executors and shuffle partitions asked for
        assert got["master"] == master and got["worker_hash"] == facts["hash"], got
        assert (got["parallelism"], got["executors"], got["shuffle_partitions"]) == (*want, str(SESSIONS[master]))
    for case in CASES:
        dests = {
            f"{how}, PYTHONHASHSEED={seed}": d[case]
            for how, d in [("in process", spec["in_process"]), *spec["spark"].items()]
        }
        diff = differing(dests, reference[case])
        assert not diff, f"{case}: archives that differ from the in-process compaction, and where: {diff}"


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(case=small_archive(), shuffle_partitions=st.sampled_from(["1", "3", "200"]), data=st.data())
def test_drawn_archives_on_local2_in_any_chunk_order_write_the_in_process_bytes(
    spark, tmp_path_factory, case, shuffle_partitions, data
):
    """Beside test_compactor's twelve (listed order, the session's 4 shuffle partitions): drawn archives,
    each compacted on `local[2]` and in process, each given the chunks in a drawn order."""
    chunks, groups, duration, sizes = case
    root = tmp_path_factory.mktemp("drawn")
    src = open_storage(str(root / "src"))
    for p, offs, ts, ks in chunks:
        write_chunk(src, envelope_records(p, offs, ts, ks), "t", codec="null")
    options = dict(groups=groups, slice_duration=duration, seal_all=True, **sizes)
    in_spark, in_process = (data.draw(st.permutations(range(len(chunks))), label=n) for n in ("spark", "in process"))
    compact_as(None, src.url, str(root / "in-process"), options, in_process)
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", shuffle_partitions)
    try:
        compact_as(spark, src.url, str(root / "local2"), options, in_spark)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
    reference = canonical_files(str(root / "in-process"))
    diff = differing({"local[2]": str(root / "local2")}, reference)
    assert not diff, f"archives that differ, and where: {diff}"


@CONNECT
def test_a_spark_connect_session_writes_the_in_process_bytes(connect, inputs, tmp_path):
    """From a Spark Connect client (pyspark's own server, another process with its own
    JVM and Python workers): the DataFrame-only path (`compactor.execution.OnSpark` on a
    session with no SparkContext) writes the bytes of the in-process compactor, and so of
    the classic sessions above, both cases with the chunks handed over shuffled too; and
    with every task's function handed to the executors through the run's store (as a
    source's chunk list too large for a Connect request is), which leaves none behind."""
    source, reference = inputs
    for case, options in CASES.items():
        dests = {name: str(tmp_path / f"{case}-{n}") for n, name in enumerate(["connect", "shuffled", "carried"])}
        connect.run(compact_as, source, dests["connect"], options)
        connect.run(compact_as, source, dests["shuffled"], options, SHUFFLED)
        stored, left = connect.run(compact_carried, source, dests["carried"], options)
        assert stored >= 4 and left == [], (stored, left)  # statistics, reduce, rewrite's two
        diff = differing(dests, reference[case])
        assert not diff, f"{case}: archives that differ from the in-process compaction, and where: {diff}"


def compact_carried(spark, source: str, dest: str, options: dict) -> tuple[int, list[str]]:
    """A compaction whose every task function goes through the run's store: how many went
    so, and what of them is left in `_runs/` afterwards."""
    from compactor import execution

    before, close = execution.CARRIED_BYTES, execution.OnSpark.close
    stored = []

    def counted(self):
        stored.extend(self.stored)
        close(self)

    execution.CARRIED_BYTES, execution.OnSpark.close = 0, counted
    try:
        compact_as(spark, source, dest, options)
    finally:
        execution.CARRIED_BYTES, execution.OnSpark.close = before, close
    return len(set(stored)), [o.key for o in open_storage(dest).list("_runs/") if ".task-" in o.key]
