"""Compactions, appends and the audit through an object store's refusals, on S3, GCS and
Azure (an `HttpFaultProxy` in front of each emulator; tests/test_http_faults.py has the
single reads): 503 to every request of the destination from the first segment file on fails
the run in one line naming an object there and commits nothing; the rerun, through a burst
of 503s on the destination's writes and 429s on the source's reads, commits, and the archive
holds every record of the source once. All in process (`compact(cfg)` with no Spark
session): the stores' code is the same in a Spark task, and Spark's start is not what these
test. Then the Spark source (`format("keyfill")`) reading through 503s."""

from __future__ import annotations

import os
import threading
import time

import pyarrow as pa
import pytest

import reader.spark
from compactor.job import CompactConfig, compact
from compactor.sources import open_source
from compactor.verify import verify
from keyfill.synth.generate import GeneratorConfig, generate
from keygroups import compacted
from keygroups.storage import StorageError, open_storage
from tests.records import below_handoff, copy_archive, copy_share
from tests.test_http_faults import proxied

pytestmark = [pytest.mark.stores, pytest.mark.faults]  # each store behind a fault proxy

BACKENDS = ["s3", "gcs", "azure"]
# a run's options: tiny and quick (3,000 records, 3 groups, slices of 5 s)
OPTIONS = {"groups": 3, "slice_duration": "5s"}


@pytest.fixture(scope="module")
def topic(tmp_path_factory) -> str:
    """3,000 records over 3 partitions in 12 chunk files: a source that grows by files."""
    out = str(tmp_path_factory.mktemp("http-fault-runs") / "topic")
    generate(
        GeneratorConfig(
            out=out, records=3_000, keys=100, partitions=3, chunk_records=250, skew=1.1, rate=100.0, seed=5
        ),
        progress=False,
    )
    return out


def writes_under(folder: str):
    return lambda method, path: method in ("PUT", "POST") and f"/{folder}/" in path


def reads_under(folder: str):
    return lambda method, path: method == "GET" and f"/{folder}/" in path


def audited(src: str, dest: str) -> int:
    """The audit's records, after checking it found the archive sound: every record of the
    source below the hand-off once, each key's in order, in its slice. Also counted here from
    the source, so an audit that read nothing cannot pass."""
    report = verify(open_source(src), open_storage(dest), threads=3)
    assert report.ok, report.to_json()
    source = open_source(src)
    held = below_handoff(pa.Table.from_batches([source.read(c) for c in source.list_chunks()]), dest)
    assert report.records == held.num_rows > 0
    return report.records


class Outage:
    """A `Match` for every request to one folder of the store from the first write of a
    segment file there on: the run's lease is taken, its work under way."""

    def __init__(self, folder: str) -> None:
        self.folder, self.started = f"/{folder}/", False
        self._lock = threading.Lock()

    def __call__(self, method: str, path: str) -> bool:
        with self._lock:
            if self.folder not in path:
                return False
            self.started = self.started or (method in ("PUT", "POST") and f"{self.folder}groups/" in path)
            return self.started


# A run that fails: its first refused write gives up near the 2 s deadline (S3: after one more
# backoff, up to 5 s), the writes beside it too, then the run waits at most 5 s
# (compactor.lease.RECORD_S) to mark its lease failed, which the outage refuses as well:
# 1-10 s measured. Three times the sum for the busy 2-core box.
FAILED_RUN_BOUND_S = 3 * (5 + 2 + 5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_runs_and_the_audit_through_bursts_and_outages_keep_every_record_once(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, topic: str, backend: str
) -> None:
    """A compaction, then an append once the source has grown, each first meeting an outage
    of the destination (503 to every request there from its first segment write on): it fails
    in one line naming an object of the destination and commits nothing (no version; the
    append's parent stays the latest). Each is run again in the same process through bursts:
    two 503s on the destination's segment writes, one on its version object (the create-only
    commit, retried: the proxy answered, the store never saw it) and a 429 on a read of the
    source, and commits. The audit, through a 503 on a read of the archive and a 429 on one of
    the source, finds every record of the source once. All in process; the outages under
    short limits (1 s reads, 2 s deadline), the bursts under the defaults. Every fault is met."""
    url = request.getfixturevalue(f"{backend}_url")
    src, dest = f"{url}/src", f"{url}/c"
    copy_share(topic, src, 0.5)
    with proxied(request, monkeypatch, backend) as proxy:
        for step, before in (("compact", []), ("append", [1])):
            cfg = CompactConfig(source=src, dest=dest, append=step == "append", **OPTIONS)
            proxy.fail(503, times=1_000_000, match=Outage("c"))
            started = time.monotonic()
            with monkeypatch.context() as short, pytest.raises(StorageError) as err:
                short.setenv("KEYFILL_STORAGE_READ_TIMEOUT", "1")
                short.setenv("KEYFILL_STORAGE_DEADLINE", "2")
                compact(cfg)
            took = time.monotonic() - started
            proxy.clear()  # the outage ends
            message = str(err.value)
            assert f"{dest}/" in message and "\n" not in message, message
            assert took < FAILED_RUN_BOUND_S, f"{took:.1f} s: {message}"
            assert compacted.versions(open_storage(dest)) == before  # nothing committed
            print(f"{backend} {step} failed in {took:.1f} s ({proxy.failed} refused): {message}")

            refused = proxy.failed
            proxy.fail(503, times=2, match=writes_under("groups"))
            proxy.fail(503, times=1, match=writes_under("_versions"))
            proxy.fail(429, times=1, match=reads_under("src"))
            result = compact(cfg)  # the rerun, through bursts
            assert proxy.faults_left == 0 and proxy.failed == refused + 4, step  # each met a request of the run
            assert (result.kind, result.version) == (step, len(before) + 1)
            copy_share(topic, src)  # the source grows: the append's new records
        assert compacted.versions(open_storage(dest)) == [1, 2]
        proxy.fail(503, times=1, match=reads_under("groups"))
        proxy.fail(429, times=1, match=reads_under("src"))
        records = audited(src, dest)
        assert proxy.faults_left == 0
    print(f"{backend}: compacted, appended and audited {records} records, each record once")


def test_the_spark_source_reads_through_503s_every_record_once(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, spark, topic: str, tmp_path
) -> None:
    """An AvailableNow query of `format("keyfill")` over an S3 archive whose first four
    segment reads are answered 503: every record once. One store is enough: the Spark
    source's tasks read through the same `Storage.read_range` as the threaded replay, whose
    retries on each store test_http_faults checks; what this adds is the path through Spark's
    Python workers. They take their environment from the data source's registration
    (`SparkContext.environment`, read when it is registered): registered again with the
    proxy's endpoint, they go through it, and registered as before at the end."""
    url = request.getfixturevalue("s3_url")
    local = str(tmp_path / "c")
    compact(CompactConfig(source=topic, dest=local, **OPTIONS))
    copy_archive(local, url)
    with (
        proxied(request, monkeypatch, "s3") as proxy,
        spark_environment(spark, {"AWS_ENDPOINT_URL": os.environ["AWS_ENDPOINT_URL"]}),
    ):
        proxy.fail(503, times=4, match=lambda method, path: method == "GET" and "/groups/" in path)
        got: list[pa.Table] = []
        (
            spark.readStream.format("keyfill")
            .load(url)
            .writeStream.foreachBatch(lambda batch, _: got.append(batch.select("partition", "offset").toArrow()))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
            .awaitTermination()
        )
        assert proxy.faults_left == 0 and proxy.failed == 4  # the workers' reads went through the proxy
    rows = pa.concat_tables(got)
    positions = list(zip(rows.column("partition").to_pylist(), rows.column("offset").to_pylist()))
    source = open_source(topic)
    held = below_handoff(pa.Table.from_batches([source.read(c) for c in source.list_chunks()]), local)
    assert len(positions) == len(set(positions)) == held.num_rows > 0
    assert set(positions) == set(zip(held.column("partition").to_pylist(), held.column("offset").to_pylist()))


class spark_environment:
    """`format("keyfill")` registered for a block with variables added to its Spark Python
    workers' environment (a worker is started for each distinct environment), and registered
    again with the earlier environment after it, whatever happened inside."""

    def __init__(self, spark, env: dict[str, str]) -> None:
        self.spark, self.env = spark, env
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        environment = self.spark.sparkContext.environment
        self.saved = {k: environment.get(k) for k in self.env}
        environment.update(self.env)
        reader.spark.register(self.spark)

    def __exit__(self, *exc: object) -> None:
        environment = self.spark.sparkContext.environment
        for k, v in self.saved.items():
            if v is None:
                environment.pop(k, None)
            else:
                environment[k] = v
        reader.spark.register(self.spark)
