"""keyfill from a Spark Connect client, as PySpark users on Spark 4's connect mode and the
managed platforms run it: `keyfill compact|plan|verify --remote` and `SPARK_REMOTE`, the
spark-submit entry points under `SPARK_REMOTE`, an archive error raised in a task reaching
the client as one line, executors that lack the client's credentials named in one line, and
keyfill's code found on the executors or shipped to them. The server is pyspark's own
(tests/conftest.py `connect_server`), whose environment lacks the S3 test server's
credentials. (The Spark source, the example jobs and the testing kit under Connect are
tested beside their classic twins, with the same function: test_spark_source,
test_fraud_join, test_kafka_live, test_testing_spark; the bytes of a compaction in
test_determinism.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from compactor.job import CompactConfig, compact
from keyfill.cli import main
from keygroups import compacted
from keygroups.storage import open_storage
from tests.connect_client import CONNECT
from tests.records import canonical_files, copy_share

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def client(remote: str | None, *args: str, module: str = "keyfill") -> subprocess.CompletedProcess:
    """`python -m <module> args` as a user's shell runs it, with SPARK_REMOTE set (None: not)."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "PYTHONPATH")}
    env["PYTHONPATH"] = ROOT
    if remote is not None:
        env["SPARK_REMOTE"] = remote
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT
    )


@CONNECT
def test_compact_plan_append_and_verify_over_spark_connect_make_the_in_process_archive(
    connect_server, full_source, tmp_path
):
    """`keyfill plan|compact --remote`, then `python -m jobs.compact --append`, both audits
    (`keyfill verify --spark`, `python -m jobs.verify`) and the worked example's script under
    SPARK_REMOTE: each version equals the in-process compactor's byte for byte (run ids
    aside), the audits pass, and the example reads every record, none late."""
    src, dest, ref = str(tmp_path / "src"), str(tmp_path / "connect"), str(tmp_path / "in-process")
    url = connect_server.url
    copy_share(full_source, src, 0.5)
    options = ["--groups", "3", "--slice-duration", "10s"]

    planned = client(None, "plan", src, dest, *options, "--remote", url, "--json")
    assert planned.returncode == 0, planned.stderr
    out = client(None, "compact", src, dest, *options, "--remote", url, "--json")
    assert out.returncode == 0, out.stderr
    done = json.loads(out.stdout)
    compact(CompactConfig(source=src, dest=ref, groups=3, slice_duration="10s"))
    assert json.loads(planned.stdout)["records"] == done["records"] > 0
    assert canonical_files(dest) == canonical_files(ref)

    copy_share(full_source, src, 1.0)
    out = client(url, src, dest, "--append", "--json", module="jobs.compact")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["kind"] == "append"
    compact(CompactConfig(source=src, dest=ref, append=True))
    assert compacted.versions(open_storage(dest)) == [1, 2]
    assert canonical_files(dest) == canonical_files(ref)

    audit = client(url, "verify", src, dest, "--spark", "--json")
    assert audit.returncode == 0, audit.stdout + audit.stderr
    report = json.loads(audit.stdout)
    assert report["ok"] and report["records"] == compacted.load_manifest(open_storage(dest)).totals.records
    job = client(url, src, dest, module="jobs.verify")
    assert job.returncode == 0 and "verified:" in job.stdout, job.stdout + job.stderr

    # the worked example's own script (its session: `jobs.example_session`) on the archive
    records = compacted.load_manifest(open_storage(dest)).totals.records
    example = client(url, dest, "--out", str(tmp_path / "fraud"), "--overwrite", module="jobs.fraud_backfill")
    assert example.returncode == 0, example.stdout + example.stderr
    assert f"fraud backfill: {records:,} records from " in example.stdout, example.stdout
    assert "0 records dropped as late" in example.stdout, example.stdout


@CONNECT
def test_an_archive_error_in_a_task_reaches_a_connect_client_as_one_line(connect_server, full_source, tmp_path):
    """A chunk cut short, met by a task on the server's executor: the client prints
    keyfill's one line naming the file (not a gRPC error or a Python traceback), exits 2,
    and leaves no visible archive."""
    src, dest = str(tmp_path / "src"), str(tmp_path / "c")
    copy_share(full_source, src, 0.5)
    store = open_storage(src)
    victim = sorted(o.key for o in store.list() if o.key.endswith(".avro"))[1]
    store.write(victim, store.read(victim)[: store.size(victim) // 2])
    out = client(connect_server.url, "compact", src, dest, "--groups", "2", "--slice-duration", "10s")
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 2 and last.startswith("keyfill compact: error: "), out.stderr
    assert f"{src}/{victim}" in last, last
    assert "Traceback" not in out.stderr and "grpc" not in out.stderr.lower(), out.stderr
    assert compacted.versions(open_storage(dest)) == []


@CONNECT
def test_executors_without_the_clients_credentials_are_named_in_one_line(connect_server, s3_url, tmp_path):
    """The client reaches the S3 server (its environment has the credentials); the Connect
    server's executors do not (a cluster's environment is its own): one line naming the
    archive and saying whose settings count, exit 2, before any pass runs."""
    from keyfill.synth.generate import GeneratorConfig, generate

    src = f"{s3_url}/src"
    generate(GeneratorConfig(out=src, records=2_000, keys=50, partitions=2, chunk_records=500), progress=False)
    out = client(connect_server.url, "compact", src, f"{s3_url}/c", "--groups", "2", "--slice-duration", "10s")
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 2, out.stderr
    assert last.startswith(f"keyfill compact: error: Spark's executors cannot read the source archive {src}"), last
    assert "the cluster's own credentials" in last and "docs/deploy.md" in last, last
    assert "Traceback" not in out.stderr, out.stderr
    assert compacted.versions(open_storage(f"{s3_url}/c")) == []


def test_master_and_remote_are_one_or_the_other(tmp_path, monkeypatch, capsys):
    """A Connect client cannot choose the server's master: both given is refused before
    any work, from the flags (argparse) or from --master beside SPARK_REMOTE."""
    src, dest = str(tmp_path / "src"), str(tmp_path / "c")
    with pytest.raises(SystemExit) as exit_:
        main(["compact", src, dest, "--master", "local[2]", "--remote", "sc://127.0.0.1:1"])
    assert exit_.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    monkeypatch.setenv("SPARK_REMOTE", "sc://127.0.0.1:1")
    for command in (["compact", src, dest], ["plan", src, dest], ["verify", src, dest, "--spark"]):
        assert main([*command, "--master", "local[2]"]) == 2
        err = capsys.readouterr().err
        assert "--master local[2] and SPARK_REMOTE=sc://127.0.0.1:1 both given" in err, err


def test_a_server_that_does_not_answer_is_one_line(tmp_path, full_source, capsys):
    """--remote to a port nobody serves: one line naming the URL, exit 2, and the run's
    lease marked failed (nothing visible)."""
    src, dest = str(tmp_path / "src"), str(tmp_path / "c")
    copy_share(full_source, src, 0.25)
    out = client(None, "compact", src, dest, "--remote", "sc://127.0.0.1:1", "--groups", "2")
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 2 and last.startswith("keyfill compact: error: "), out.stderr
    assert "sc://127.0.0.1:1" in last and "Traceback" not in out.stderr, out.stderr
    assert compacted.versions(open_storage(dest)) == []


@CONNECT
def test_the_executors_find_keyfill_or_are_given_it(connect):
    """The server's workers run this interpreter, which has keyfill: the look finds this
    version and ships nothing. Told the executors hold another version, a new session gets
    this installation's packages as a Python artifact, first on its workers' path."""
    found, shipped, first = connect.run(executors_find_keyfill_or_are_given_it)
    assert found == {"missing": [], "version": found["version"]} and found["version"]
    assert shipped is not None and shipped.endswith(".zip")
    assert os.path.basename(first) == os.path.basename(shipped), first


def executors_find_keyfill_or_are_given_it(spark) -> tuple:
    import zipfile

    import pyarrow as pa
    from pyspark.sql import SparkSession

    from keygroups import executor_code

    found = executor_code.look_on_executors(spark)
    assert executor_code.ship_to_executors(spark) is None  # the same version is installed there
    other = SparkSession.builder.remote(os.environ["SPARK_REMOTE"]).create()  # artifacts are a session's
    mine = executor_code._version
    executor_code._version = lambda: "0.0.0+another"
    try:
        shipped = executor_code.ship_to_executors(other)
    finally:
        executor_code._version = mine
    with zipfile.ZipFile(shipped) as z:
        names = set(z.namelist())
    assert {"keygroups/__init__.py", "compactor/execution.py", "reader/spark/source.py"} <= names, sorted(names)[:20]
    assert not any(n.endswith(".pyc") for n in names)

    def first_zip(batches):  # nested: pickled by value (the workers cannot import tests)
        import sys

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"path": [next((p for p in sys.path if p.endswith(".zip")), "")]})

    first = other.range(0, 1, 1, 1).mapInArrow(first_zip, "path string").toArrow().column(0)[0].as_py()
    other.stop()
    return found, shipped, first


def test_a_connect_jobs_stages_are_drawn_on_one_line_of_stderr(capsys):
    """What `keyfill compact --remote` shows on a terminal while a job runs: the first stage
    not done, as Spark's console progress bar shows it, and the line cleared when done."""
    from pyspark.sql.connect.shell.progress import StageInfo

    from compactor.spark_session import _StageProgress

    draw = _StageProgress()
    draw(
        stages=[StageInfo(2, 4, 4, 0, True), StageInfo(3, 8, 5, 0, False)],
        inflight_tasks=2,
        operation_id="o",
        done=False,
    )
    draw(stages=[], inflight_tasks=0, operation_id="o", done=True)
    out = capsys.readouterr()
    assert out.out == "" and out.err == "\r\033[K[Stage 3: (5 + 2) / 8]\r\033[K"


@CONNECT
def test_verify_on_connect_refuses_a_plan_too_large_for_a_request_in_one_line(connect, full_source, tmp_path):
    """verify --spark has no run's store to hand a large task function through: past what a
    Connect request carries it stops with keyfill's error, not a client retrying for
    minutes (the limit lowered to nothing here, so the example's small list exceeds it)."""
    src, dest = str(tmp_path / "src"), str(tmp_path / "c")
    copy_share(full_source, src, 0.25)
    compact(CompactConfig(source=src, dest=dest, groups=2, slice_duration="10s"))
    assert connect.run(verify_with_nothing_carried, src, dest).startswith("a Spark task's function holds ")


def verify_with_nothing_carried(spark, src: str, dest: str) -> str:
    from compactor import execution
    from compactor.errors import ConnectRequestTooLarge
    from compactor.sources import open_source
    from compactor.verify.spark import verify_spark

    before, execution.CARRIED_BYTES = execution.CARRIED_BYTES, 0
    try:
        verify_spark(open_source(src), open_storage(dest), spark)
    except ConnectRequestTooLarge as exc:
        return str(exc)
    finally:
        execution.CARRIED_BYTES = before
    raise AssertionError("verify_spark ran")


class _Planted:
    """A pickle that runs code when loaded: it creates the file it names."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (open, (self.marker, "w"))


def test_a_stored_task_is_loaded_only_as_the_driver_wrote_it(tmp_path):
    """The check itself, in this process: the bytes the driver wrote load; a pickle put in
    their place is refused in one line naming the object, and none of its code runs."""
    import hashlib

    from pyspark import cloudpickle

    from compactor import execution
    from compactor.errors import TaskCodeMismatch

    store, marker = open_storage(str(tmp_path / "dest")), str(tmp_path / "ran")
    body = cloudpickle.dumps(lambda batches: (b for b in batches))
    store.write("_runs/r.task-1.pickle", body)
    assert list(execution.load_task(store, "_runs/r.task-1.pickle", hashlib.sha256(body).hexdigest())([1, 2])) == [1, 2]
    store.write("_runs/r.task-2.pickle", __import__("pickle").dumps(_Planted(marker)))
    with pytest.raises(TaskCodeMismatch, match=r"r\.task-2\.pickle: this run's task code was replaced"):
        execution.load_task(store, "_runs/r.task-2.pickle", hashlib.sha256(body).hexdigest())
    assert not os.path.exists(marker)


@CONNECT
def test_a_task_file_replaced_in_the_store_stops_the_compaction_in_one_line(connect, full_source, tmp_path):
    """Whoever may write to the destination's bucket may not run code on the executors: a
    task function handed through the run's store and replaced there by a pickle that runs
    code is refused by every worker, the compaction stops with one line naming the file,
    nothing of the planted pickle runs, and no version is visible."""
    src, dest, marker = str(tmp_path / "src"), str(tmp_path / "c"), str(tmp_path / "ran")
    copy_share(full_source, src, 0.25)
    kind, message = connect.run(compact_with_a_planted_task, src, dest, marker)
    assert kind == "TaskCodeMismatch" and "\n" not in message, (kind, message)
    assert ".task-" in message and message.startswith(dest), message
    assert not os.path.exists(marker)
    assert compacted.versions(open_storage(dest)) == []


def compact_with_a_planted_task(spark, src: str, dest: str, marker: str) -> tuple[str, str]:
    """A compaction whose every task function goes through the store, the first one written
    there replaced by a pickle that creates `marker` when loaded: the error it stops with."""
    import pickle

    from compactor import execution
    from keygroups.errors import KeyfillError

    before, carried = execution.CARRIED_BYTES, execution.OnSpark._fit_for_connect

    def planted(self, task):
        out = carried(self, task)
        self.errors.dest.write(self.stored[0], pickle.dumps(_Planted(marker)))
        return out

    execution.CARRIED_BYTES, execution.OnSpark._fit_for_connect = 0, planted
    try:
        compact(CompactConfig(source=src, dest=dest, groups=2, slice_duration="10s"), spark=spark)
    except KeyfillError as exc:
        return type(exc).__name__, str(exc)
    finally:
        execution.CARRIED_BYTES, execution.OnSpark._fit_for_connect = before, carried
    raise AssertionError("the compaction committed")
