"""A Spark Connect server that goes away while keyfill runs on it: frozen (SIGSTOP: a driver
stalled, a network that drops packets) or killed (SIGKILL: a cluster restart, a driver's
OOM), before the session is made and between two Spark jobs of a compaction or a verify. The command
ends with one line naming the endpoint within the bound (KEYFILL_CONNECT_TIMEOUT, short
here, plus a probe's deadline: `keygroups.connect_watch`), the destination shows no version
and the run's lease is failed, and the same command run again once the server is back
commits; a streaming query's job run again goes on from its checkpoint exactly once. The
server is one of this module's own, since the tests stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from keyfill.testing.connect_server import ConnectServer, start_connect_server
from keygroups import compacted
from keygroups.storage import open_storage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = "4"  # KEYFILL_CONNECT_TIMEOUT for these commands
BETWEEN_JOBS = "distinct keys"  # logged (-v) after the statistics pass, before the rewrite's jobs
VERIFY_BETWEEN_JOBS = "comparing their records"  # logged (-v) after the file checks, before the comparison
# one worker: the server is the module's
pytestmark = [pytest.mark.xdist_group("connect-lost"), pytest.mark.connect, pytest.mark.spark, pytest.mark.faults]


class Victim:
    """This module's Connect server, which the tests freeze, thaw, kill and start again."""

    def __init__(self) -> None:
        self.server: ConnectServer = start_connect_server(conf={"spark.sql.shuffle.partitions": "4"})

    def signal(self, sig: int) -> None:
        os.killpg(self.server.process.pid, sig)  # the JVM and its Python workers

    def restart(self) -> None:
        self.server.stop()
        self.server = start_connect_server(conf={"spark.sql.shuffle.partitions": "4"})


@pytest.fixture(scope="module")
def victim() -> Iterator[Victim]:
    found = Victim()
    try:
        yield found
    finally:
        found.signal(signal.SIGCONT)
        found.server.stop()


@pytest.fixture(scope="module")
def topic(tmp_path_factory) -> str:
    """100K records over 10K keys: enough keys that the statistics pass logs its buckets."""
    src = str(tmp_path_factory.mktemp("lost") / "src")
    args = ["generate", "--out", src, "--records", "100000", "--chunk-records", "20000", "--no-progress"]
    assert keyfill(*args).returncode == 0
    return src


def keyfill(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "import sys; from keyfill.cli import main; sys.exit(main())", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env or os.environ.copy(),
        timeout=600,
    )


def stopped_at(line: str, sig: int, victim: Victim, args: list[str], env: dict[str, str]) -> tuple[int, list[str]]:
    """Run `args` with `env` and send the server `sig` when the command's stderr shows `line`
    (or at once when `line` is empty): its exit status and stderr's lines."""
    if not line:
        victim.signal(sig)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from keyfill.cli import main; sys.exit(main())", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert proc.stderr is not None
    lines, sent = [], not line
    for got in proc.stderr:
        lines.append(got.rstrip("\n"))
        if not sent and line in got:
            victim.signal(sig)
            sent = True
    assert proc.wait(timeout=600) is not None
    assert sent, "\n".join(lines)  # the command reached the point where the server went away
    return proc.returncode, lines


def ended_in_one_line(code: int, lines: list[str], command: str, url: str) -> str:
    last = lines[-1] if lines else ""
    assert code == 2 and last.startswith(f"keyfill {command}: error: "), "\n".join(lines)
    assert url in last and "did not answer for" in last, last
    assert not any(line.startswith("Traceback") for line in lines), "\n".join(lines)
    return last


def lease_states(dest: str) -> list[str]:
    import json

    store = open_storage(dest)
    return [json.loads(store.read(o.key))["state"] for o in store.list("_runs/") if compacted.run_of_lease(o.key)]


@pytest.mark.parametrize("when", [BETWEEN_JOBS, ""], ids=["between-jobs", "before-the-session"])
def test_a_frozen_server_ends_a_compaction_in_one_line_and_a_rerun_commits(victim, topic, tmp_path, when):
    dest = str(tmp_path / "c")
    env = {**os.environ, "KEYFILL_CONNECT_TIMEOUT": TIMEOUT_S}
    args = ["-v", "compact", topic, dest, "--groups", "4", "--slice-duration", "1m", "--remote", victim.server.url]
    try:
        code, lines = stopped_at(when, signal.SIGSTOP, victim, args, env)
    finally:
        victim.signal(signal.SIGCONT)
    ended_in_one_line(code, lines, "compact", victim.server.url)
    assert compacted.versions(open_storage(dest)) == []
    assert lease_states(dest) == ["failed"]
    again = keyfill(*args[1:], env=env)
    assert again.returncode == 0, again.stderr
    assert compacted.versions(open_storage(dest)) == [1]


def test_a_killed_server_ends_a_compaction_and_a_verify_in_one_line(victim, topic, tmp_path):
    """Killed between the compaction's jobs; then, the server started again, the rerun
    commits; and a verify --spark whose server freezes between its jobs ends in one line
    too (the server thawed, it verifies the archive)."""
    dest = str(tmp_path / "c")
    env = {**os.environ, "KEYFILL_CONNECT_TIMEOUT": TIMEOUT_S}
    compact = ["compact", topic, dest, "--groups", "4", "--slice-duration", "1m"]
    code, lines = stopped_at(BETWEEN_JOBS, signal.SIGKILL, victim, ["-v", *compact, "--remote", victim.server.url], env)
    ended_in_one_line(code, lines, "compact", victim.server.url)
    assert compacted.versions(open_storage(dest)) == [] and lease_states(dest) == ["failed"]
    victim.restart()
    again = keyfill(*compact, "--remote", victim.server.url, env=env)
    assert again.returncode == 0, again.stderr
    assert compacted.versions(open_storage(dest)) == [1]

    verify = ["verify", topic, dest, "--spark", "--remote", victim.server.url]
    try:
        code, lines = stopped_at(VERIFY_BETWEEN_JOBS, signal.SIGSTOP, victim, ["-v", *verify], env)
    finally:
        victim.signal(signal.SIGCONT)
    ended_in_one_line(code, lines, "verify", victim.server.url)
    checked = keyfill(*verify, env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_job_script_and_plan_end_in_one_line_when_their_server_is_frozen(victim, topic, tmp_path):
    """spark-submit's entry points make their session from SPARK_REMOTE, and `plan --remote`
    its own: bounded alike."""
    env = {**os.environ, "KEYFILL_CONNECT_TIMEOUT": TIMEOUT_S, "SPARK_REMOTE": victim.server.url}
    victim.signal(signal.SIGSTOP)
    try:
        out = subprocess.run(
            [sys.executable, "jobs/compact.py", topic, str(tmp_path / "c"), "--groups", "4"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=600,
        )
        planned = keyfill("plan", topic, str(tmp_path / "p"), "--groups", "4", "--remote", victim.server.url, env=env)
    finally:
        victim.signal(signal.SIGCONT)
    ended_in_one_line(planned.returncode, planned.stderr.strip().splitlines(), "plan", victim.server.url)
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 2 and last.startswith("jobs/compact.py: error: SPARK_REMOTE=sc://"), out.stderr
    assert "did not answer for" in last and "Traceback" not in out.stderr, out.stderr


def stream_to_parquet(archive: str, out: str) -> None:
    """The client of the streaming test: a job as a user runs it under SPARK_REMOTE, one
    slice a micro-batch to Parquet with a checkpoint (`python -c`, in a process of its own)."""
    from functools import partial

    from pyspark.sql import SparkSession

    import reader.spark
    from compactor.spark_session import from_builder, running_or_started
    from jobs.exit import one_line_errors

    def job() -> int:
        with running_or_started(partial(from_builder, SparkSession.builder), "test stream") as spark:
            reader.spark.register(spark)
            events = spark.readStream.format("keyfill").option("maxSlicesPerTrigger", 1).load(archive)
            writer = events.select("partition", "offset").writeStream.format("parquet")
            query = writer.option("path", f"{out}/rows").option("checkpointLocation", f"{out}/checkpoint")
            query.trigger(availableNow=True).start().awaitTermination()
        return 0

    sys.exit(one_line_errors(job, "stream"))


def test_a_stream_whose_server_is_killed_goes_on_from_its_checkpoint_exactly_once(victim, topic, tmp_path, spark):
    """Killed once a micro-batch is committed: the query's client ends in one line, and
    the job run again on the server started again goes on from the checkpoint; the sink
    holds every record of the archive once."""
    from compactor.job import CompactConfig, compact

    archive, out = str(tmp_path / "archive"), str(tmp_path / "out")
    compact(CompactConfig(source=topic, dest=archive, groups=4, slice_duration="5s", seal_all=True))
    env = {**os.environ, "KEYFILL_CONNECT_TIMEOUT": TIMEOUT_S, "SPARK_REMOTE": victim.server.url}
    slices = compacted.load_manifest(open_storage(archive)).totals.slices
    call = f"from tests.test_connect_lost import stream_to_parquet as s; s({archive!r}, {out!r})"
    client = [sys.executable, "-c", call]
    proc = subprocess.Popen(client, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    committed = os.path.join(out, "checkpoint", "commits", "0")
    deadline = time.monotonic() + 600  # a bound on a hang, not a verdict on speed
    while not os.path.exists(committed) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(committed) and proc.poll() is None  # one batch in, more to come
    victim.signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=600)
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 2 and last.startswith("stream: error: the Spark Connect server at"), err
    assert len(os.listdir(os.path.join(out, "checkpoint", "commits"))) < slices  # killed before the last batch
    victim.restart()
    env["SPARK_REMOTE"] = victim.server.url
    again = subprocess.run(client, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    import reader.spark

    reader.spark.register(spark)
    got = spark.read.parquet(f"{out}/rows")  # through the sink's log: committed files only
    expected = spark.read.format("keyfill").load(archive).select("partition", "offset")
    assert got.count() == got.distinct().count() == expected.count()
    assert got.exceptAll(expected).count() == 0
