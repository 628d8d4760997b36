"""The fault suite, part two: keyfill beside concurrent maintenance and bad input.

- vacuum looping (--retain 0s --delete) while a compaction and an append run, on local
  disk and on the S3 server: nothing of the running version is deleted, every version
  committed replays whole;
- a commit whose version would name a deleted file refuses, naming it; a run whose lease
  went unrenewed past its length never commits;
- vacuum deletes only files of expired versions and of runs whose lease ended, whatever
  else is named like an archive file;
- an append whose source was rewritten below the hand-off (offsets shifted, a chunk gone)
  refuses, naming the chunk and the offset;
- damage to an index file is named as the index file's;
- numeric options out of range, a missing bucket: refused before Spark starts;
- a corrupt chunk: the CLI's last line is the error naming it, no traceback, exit 2.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reader
from compactor import job as job_module
from compactor import lease
from compactor.errors import CompactionError, HeldBack, HistoryChanged, LeaseLost, RunInProgress
from compactor.job import CompactConfig, compact
from compactor.lease import Lease, LeaseRecord, check_alone
from compactor.sources import open_source
from compactor.sources.envelope import write_chunk
from compactor.vacuum import plan_vacuum, vacuum
from compactor.verify import verify
from keyfill.cli import main, print_compact_result
from keyfill.synth.generate import GeneratorConfig, generate
from keygroups import compacted
from keygroups.errors import FormatError, KeyfillError, StorageError
from keygroups.storage import open_storage
from tests.records import below_handoff
from tests.waits import wait_until

RUN_A, RUN_B, RUN_C, RUN_D = ("a" * 16, "b" * 16, "c" * 16, "d" * 16)


@pytest.fixture(scope="module")
def full_source(tmp_path_factory):
    src = str(tmp_path_factory.mktemp("maint") / "full")
    generate(
        GeneratorConfig(
            out=src,
            records=9_000,
            keys=150,
            partitions=3,
            chunk_records=1_500,
            skew=1.1,
            null_keys=0.02,
            headers=True,
            rate=150.0,
            seed=5,
            codec="null",
        ),
        progress=False,
    )
    return src


def read_lease(store, key: str) -> LeaseRecord:
    return LeaseRecord.parse(store.read(key))


def chunk_files(root: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".avro"))


def early_source(full: str, dest) -> str:
    """The full source less each partition's last chunk: what an append later grows."""
    shutil.copytree(full, dest)
    by_partition: dict[str, list[str]] = {}
    for f in chunk_files(str(dest)):
        by_partition.setdefault(os.path.dirname(f), []).append(f)
    for files in by_partition.values():
        os.remove(files[-1])
    return str(dest)


def records_below_handoff(src: str, url: str) -> set[tuple[int, int]]:
    s = open_source(src)
    table = below_handoff(pa.Table.from_batches([s.read(c) for c in s.list_chunks()]), url)
    return set(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist()))


def replayed(url: str) -> list[tuple[int, int]]:
    out = []
    with reader.replay(url, threads=3) as events:
        for e in events:
            if isinstance(e, reader.Records):
                out += zip(e.batch.column("partition").to_pylist(), e.batch.column("offset").to_pylist())
    return out


def compact_with_vacuum_looping(cfg: CompactConfig, spark, url: str) -> int:
    """Run the compaction in a thread while vacuum (retain 0, delete) loops; returns the
    largest number of live-run files a vacuum kept (its protection was exercised)."""
    store = open_storage(url)
    outcome: list = []
    worker = threading.Thread(target=lambda: outcome.append(compact(cfg, spark)))
    worker.start()
    kept = 0
    while worker.is_alive():
        plan = plan_vacuum(store, retain_ms=0)
        kept = max(kept, plan.kept_live)
        vacuum(store, plan)
        time.sleep(0.05)
    worker.join()
    assert outcome, "the compaction failed"
    return kept


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
def test_vacuum_looping_beside_a_compaction_and_an_append_loses_nothing(spark, full_source, tmp_path, request, backend):
    src = early_source(full_source, tmp_path / "src")
    url = request.getfixturevalue(f"{backend}_url")
    cfg = dict(source=src, dest=url, groups=4, slice_duration="5s")
    compact(CompactConfig(**cfg), spark)
    assert compact_with_vacuum_looping(CompactConfig(**cfg, overwrite=True), spark, url) > 0
    for f in chunk_files(full_source):  # the source grows: the chunks left out come back
        target = os.path.join(src, os.path.relpath(f, full_source))
        if not os.path.exists(target):
            shutil.copy(f, target)
    assert compact_with_vacuum_looping(CompactConfig(**cfg, append=True), spark, url) > 0
    store = open_storage(url)
    assert compacted.load_manifest(store).version == 3
    got = replayed(url)
    assert len(got) == len(set(got)) and set(got) == records_below_handoff(src, url)
    assert verify(open_source(src), store).ok


def test_a_commit_refuses_a_version_naming_a_deleted_file(spark, full_source, tmp_path, monkeypatch):
    url = str(tmp_path / "c")
    cfg = dict(source=full_source, dest=url, groups=3, slice_duration="10s")
    compact(CompactConfig(**cfg), spark)
    store = open_storage(url)
    original = job_module.write_manifest

    def vacuumed_meanwhile(prepared, *args, **kwargs):  # someone deletes one of the run's files before it commits
        victim = next(o.key for o in store.list(compacted.GROUPS + "/") if prepared.run in o.key)
        store.delete(victim)
        vacuumed_meanwhile.victim = store.url_for(victim)
        return original(prepared, *args, **kwargs)

    monkeypatch.setattr(job_module, "write_manifest", vacuumed_meanwhile)
    with pytest.raises(CompactionError, match="missing, yet version 2 would name it") as err:
        compact(CompactConfig(**cfg, overwrite=True), spark)
    assert vacuumed_meanwhile.victim in str(err.value)
    assert compacted.versions(store) == [1]
    leases = [read_lease(store, o.key) for o in store.list(compacted.RUNS + "/") if compacted.run_of_lease(o.key)]
    assert [lease.state for lease in leases] == ["failed"]  # vacuum may take the failed run's files now


def test_a_lease_left_unrenewed_past_its_length_is_lost(tmp_path):
    store = open_storage(str(tmp_path))
    # 10 s, renewed every 2.5 s: held unless its renewals stall 10 s (a busy machine may hold a
    # thread back a second or two; a shorter lease was lost there, as the product says it must be)
    healthy = Lease(store, RUN_A, "compact", duration_ms=10_000).acquire()
    first = LeaseRecord.parse(store.read(compacted.lease_key(RUN_A)))
    wait_until(
        lambda: LeaseRecord.parse(store.read(compacted.lease_key(RUN_A))).renewed_ms > first.renewed_ms,
        "the lease renewed by its thread",
    )
    healthy.check()  # held
    healthy.release(failed=False)
    assert not store.exists(compacted.lease_key(RUN_A))  # a committed run's lease goes

    frozen = Lease(store, RUN_B, "compact", duration_ms=1_000).acquire()
    frozen._stop.set()  # the process stalls: no renewal reaches storage
    frozen._thread.join()
    time.sleep(1.2)
    with pytest.raises(LeaseLost, match=f"{RUN_B}.json"):
        frozen.check()
    frozen.release(failed=True)
    assert LeaseRecord.parse(store.read(compacted.lease_key(RUN_B))).state == "failed"


def test_a_compaction_started_beside_a_running_one_stops_before_writing(full_source, tmp_path):
    """Two runs into one destination: the one that started second stops at once, naming the
    first and what to do, instead of finding out at its commit; a failed run's lease stops
    no one. (In process: the check comes before any Spark job.)"""
    url = str(tmp_path / "c")
    store = open_storage(url)
    rival = Lease(store, RUN_A, "compact").acquire()  # a run on another machine, still writing
    try:
        with pytest.raises(RunInProgress, match=f"run {RUN_A}") as err:
            compact(CompactConfig(source=full_source, dest=url, groups=3))
        assert store.url_for(compacted.lease_key(RUN_A)) in str(err.value) and "--append" in str(err.value)
        leases = [read_lease(store, o.key) for o in store.list()]
        assert sorted((r.run == RUN_A, r.state) for r in leases) == [(False, "failed"), (True, "running")]
    finally:
        rival.release(failed=True)
    # A run of this host whose process has exited without ending its lease (killed, or its
    # store stopped answering as it failed) stops no one either.
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = LeaseRecord(
        "e" * 16, "compact", socket.gethostname(), int(exited.stdout), 1, 1, int(time.time() * 1000) + 60_000
    )
    store.write(compacted.lease_key(dead.run), compacted.dumps(asdict(dead)))
    assert compact(CompactConfig(source=full_source, dest=url, groups=3)).version == 1


def checked_as_a_run_does(store, rec: LeaseRecord, went_on: list[str], **kwargs) -> None:
    """What `take_lease` does once the lease is created: look, and on RunInProgress mark the
    lease failed."""
    try:
        check_alone(store, rec, **kwargs)
        went_on.append(rec.run)
        rec.alone = True  # Lease.went_on
        store.write(compacted.lease_key(rec.run), compacted.dumps(asdict(rec)))
    except RunInProgress as exc:
        assert "keyfill versions" in str(exc)
        rec.state = "failed"
        store.write(compacted.lease_key(rec.run), compacted.dumps(asdict(rec)))


@given(st.lists(st.tuples(st.integers(0, 3), st.booleans(), st.booleans()), min_size=1, max_size=6))
@settings(max_examples=150, deadline=None)
def test_of_runs_starting_together_exactly_the_first_live_one_goes_on(runs):
    """Runs that all created their leases, then look at once, each in a thread (started_ms
    drawn from a few values, so ties are common), beside leases that failed or lapsed: the
    earliest live one by (started_ms, run) goes on, once the others stopped; no other does."""
    now = 10_000_000
    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        mp.setattr(lease, "LATER_POLL_S", 0.01)
        store = open_storage(d)
        records = []
        for i, (started, failed, lapsed) in enumerate(runs):
            rec = LeaseRecord(f"{i:016x}", "compact", "h", 1, started, started, now - 1 if lapsed else now + 60_000)
            rec.state = "failed" if failed else "running"
            store.write(compacted.lease_key(rec.run), compacted.dumps(asdict(rec)))
            records.append(rec)
        live = [r for r in records if r.state == "running" and r.expires_ms >= now]
        went_on: list[str] = []
        looks = {"now_ms": now, "wait_s": 60}
        threads = [threading.Thread(target=checked_as_a_run_does, args=(store, r, went_on), kwargs=looks) for r in live]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert went_on == ([min(live, key=lambda r: (r.started_ms, r.run)).run] if live else [])


def test_a_run_stamped_first_whose_lease_came_second_stops_naming_the_one_that_went_on(tmp_path, monkeypatch):
    """The race the held-out check lost on S3: run B stamps its lease first but its create is
    slow; run A creates and looks in between, sees no one and goes on. B then sees A, ordered
    after it: A does not stop (it never saw B). A's lease says it went on, so B stops at once,
    naming it, without waiting; had A said nothing, B would stop once its wait ran out. Both
    went on before (the commit decided, after both had done all their work)."""
    waits: list[float] = []
    monkeypatch.setattr(lease, "_pause", waits.append)
    store = open_storage(str(tmp_path))
    b = LeaseRecord(RUN_B, "compact", "another-host", 1, 1_000, 1_000, int(time.time() * 1000) + 60_000)
    a = LeaseRecord(RUN_A, "compact", "another-host", 2, 2_000, 2_000, int(time.time() * 1000) + 60_000)
    went_on: list[str] = []
    store.write(compacted.lease_key(a.run), compacted.dumps(asdict(a)))
    checked_as_a_run_does(store, a, went_on)  # B's lease is not there yet
    store.write(compacted.lease_key(b.run), compacted.dumps(asdict(b)))
    with pytest.raises(RunInProgress, match=f"run {RUN_A}"):
        check_alone(store, b, wait_s=60)
    assert went_on == [RUN_A] and waits == []
    a.alone = False  # as if A's mark had not reached the store: B waits until its wait runs out
    store.write(compacted.lease_key(a.run), compacted.dumps(asdict(a)))
    with pytest.raises(RunInProgress, match=f"run {RUN_A}"):
        check_alone(store, b, wait_s=0)


@pytest.fixture(scope="module")
def small_archive(spark, full_source, tmp_path_factory):
    url = str(tmp_path_factory.mktemp("maint") / "archive")
    compact(CompactConfig(source=full_source, dest=url, groups=4, slice_duration="10s", codec="null"), spark)
    return url


def test_vacuum_deletes_only_what_expired_versions_and_ended_runs_wrote(small_archive, tmp_path):
    url = str(tmp_path / "c")
    shutil.copytree(small_archive, url)
    store = open_storage(url)
    before = {o.key for o in store.list()}
    now = int(time.time() * 1000)

    def lease(run: str, state: str, expires_ms: int, groups: int | None) -> None:
        rec = LeaseRecord(run, "compact", "host", 1, now - 10_000, now - 10_000, expires_ms, state, groups)
        store.write(compacted.lease_key(run), compacted.dumps(rec.__dict__))

    def seg(group: int, run: str) -> str:
        key = compacted.segment_key(group, 0, run)
        store.write(key, b"x")
        return key

    lease(RUN_A, "running", now + 600_000, None)  # a live run, however old its files
    live = {seg(0, RUN_A), compacted.assignment_key(RUN_A)}
    store.write(compacted.assignment_key(RUN_A), b"x")
    lease(RUN_B, "failed", now + 600_000, 4)  # a failed run of 4 groups
    failed = {seg(1, RUN_B), compacted.run_error_key(RUN_B)}
    store.write(compacted.run_error_key(RUN_B), b"{}")
    beyond = seg(99, RUN_B)  # named like the failed run's, yet not one it could write
    lease(RUN_C, "running", now - 3_600_000, None)  # unrenewed for an hour: ended
    stale = {seg(2, RUN_C)}
    unknown = {seg(0, RUN_D), f"index/0000000000-{RUN_D}.pieces.parquet", compacted.assignment_key(RUN_D)}
    for key in unknown - {compacted.segment_key(0, 0, RUN_D)}:
        store.write(key, b"x")
    (tmp_path / "c" / "notes.txt").write_text("the team's")

    plan = plan_vacuum(store, retain_ms=0)
    gone = failed | stale | {compacted.lease_key(RUN_B), compacted.lease_key(RUN_C)}
    assert set(plan.files) == gone
    assert set(plan.files[-2:]) == {compacted.lease_key(RUN_B), compacted.lease_key(RUN_C)}  # leases last
    assert (plan.kept_live, plan.kept_unknown) == (len(live) + 1, len(unknown) + 1)  # + the lease; + `beyond`
    vacuum(store, plan)
    after = {o.key for o in store.list()}
    assert after == (before | live | unknown | {beyond, compacted.lease_key(RUN_A), "notes.txt"})
    assert len(replayed(url)) == compacted.load_manifest(store).totals.records


def shift_partition_from(src: str, partition: int, offset: int, by: int) -> str:
    """Replace the chunk of `partition` holding `offset`, and the chunks after it, with
    copies whose offsets are shifted by `by`; returns the URL of the copy that holds `offset` now."""
    source = open_source(src)
    store = open_storage(src)
    mine = sorted((c for c in source.list_chunks() if c.partition == partition), key=lambda c: c.first_offset)
    holder = max(i for i, c in enumerate(mine) if c.first_offset <= offset)
    written = []
    for c in mine[holder:]:
        batch = source.read(c)
        offsets = pc.add(batch.column("offset"), by)
        store.delete(c.key)
        written.append(write_chunk(store, batch.set_column(1, "offset", offsets), c.topic, codec="null"))
    return store.url_for(written[0])


@pytest.mark.parametrize("change", ["shifted", "missing"])
def test_an_append_refuses_a_source_rewritten_below_its_handoff(spark, full_source, tmp_path, change):
    src = early_source(full_source, tmp_path / "src")
    url = str(tmp_path / "c")
    compact(CompactConfig(source=src, dest=url, groups=4, slice_duration="5s"), spark)
    manifest = compacted.load_manifest(open_storage(url))
    last = manifest.last_records[1]
    assert last.offset == manifest.handoff[1] - 1  # the record just below the hand-off
    for f in chunk_files(full_source):  # the source grows
        target = os.path.join(src, os.path.relpath(f, full_source))
        if not os.path.exists(target):
            shutil.copy(f, target)
    if change == "shifted":
        chunk = shift_partition_from(src, 1, last.offset, 7)
        with pytest.raises(HistoryChanged, match=f"offset {last.offset} of partition 1 differs") as err:
            compact(CompactConfig(source=src, dest=url, append=True), spark)
    else:  # the chunk holding it, less that record
        source, store = open_source(src), open_storage(src)
        holder = max(
            (c for c in source.list_chunks() if c.partition == 1 and c.first_offset <= last.offset),
            key=lambda c: c.first_offset,
        )
        chunk = source.store.url_for(holder.key)
        batch = source.read(holder)
        store.delete(holder.key)
        write_chunk(store, batch.filter(pc.not_equal(batch.column("offset"), last.offset)), holder.topic, codec="null")
        with pytest.raises(HistoryChanged, match=f"holds no record at offset {last.offset} of partition 1") as err:
            compact(CompactConfig(source=src, dest=url, append=True), spark)
    assert chunk in str(err.value)
    assert compacted.versions(open_storage(url)) == [1]


@pytest.mark.parametrize("where", ["rows", "footer"])
def test_damage_to_an_index_file_is_named_as_the_index_files(small_archive, tmp_path, where):
    url = str(tmp_path / "c")
    shutil.copytree(small_archive, url)
    store = open_storage(url)
    key = next(o.key for o in store.list(compacted.INDEX + "/") if o.key.endswith(".pieces.parquet"))
    data = bytearray(store.read(key))
    at = len(data) // 3 if where == "rows" else len(data) - 40  # a data page, or the footer
    data[at] ^= 0x10
    store.write(key, bytes(data))
    with pytest.raises(KeyfillError) as err:  # the replay's own error type, with the index file's message
        replayed(url)
    assert store.url_for(key) in str(err.value) and ".avro" not in str(err.value)


def test_options_out_of_range_and_a_missing_bucket_are_refused_before_spark_starts(
    full_source, small_archive, s3_server, tmp_path, monkeypatch, capsys
):
    import compactor.spark_session

    def no_spark(*args, **kwargs):
        raise AssertionError("Spark started before the options were checked")

    monkeypatch.setattr(compactor.spark_session, "local_spark", no_spark)
    cases = [
        (["compact", full_source, str(tmp_path / "c"), "--groups", "1000000000000"], "--groups", "65,536"),
        (["compact", full_source, str(tmp_path / "c"), "--slice-duration", "10000d"], "--slice-duration", "between"),
        (["compact", full_source, "s3://no-such-bucket-kf/c"], "no-such-bucket-kf", ""),
        (["replay", small_archive, "--threads", "100000"], "threads 100,000", "1,024"),
        (["replay", small_archive, "--watermark-bound-ms", str(10**15)], "watermark_bound_ms", "between"),
    ]
    for argv, names, limit in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and names in err and limit in err, err
    assert not os.path.exists(tmp_path / "c")


@pytest.mark.spark  # the CLI compacts on Spark
def test_a_corrupt_chunk_ends_the_cli_with_one_line_naming_it(full_source, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(full_source, bad)
    victim = chunk_files(str(bad))[4]
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) - 300)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "keyfill"),
            "compact",
            str(bad),
            str(tmp_path / "c"),
            "--master",
            "local[2]",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert lines[-1].startswith("keyfill compact: error: ") and os.path.basename(victim) in lines[-1], done.stderr
    assert "Traceback" not in done.stderr and "Exception in task" not in done.stderr, done.stderr
    store = open_storage(str(tmp_path / "c"))
    assert compacted.versions(store) == []
    (lease,) = [read_lease(store, o.key) for o in store.list(compacted.RUNS + "/") if compacted.run_of_lease(o.key)]
    assert lease.state == "failed"
    kept = json.loads(store.read(compacted.run_error_key(lease.run)))
    where = store.url_for(compacted.run_error_key(lease.run))
    assert f"{kept['message']}; the task's traceback is in {where}" == lines[-1].split("error: ", 1)[1]
    assert "Traceback" in kept["traceback"] and os.path.basename(victim) in kept["traceback"]


def test_vacuum_refuses_to_judge_what_it_cannot_read(tmp_path):
    store = open_storage(str(tmp_path))
    store.write(compacted.segment_key(0, 0, RUN_A), b"x")
    with pytest.raises((FormatError, StorageError)):
        plan_vacuum(store, retain_ms=0)  # no version: not an archive, nothing deleted
    assert store.exists(compacted.segment_key(0, 0, RUN_A))


def test_records_held_back_are_loud_and_can_fail_a_scripted_run(spark, full_source, tmp_path, capsys):
    url = str(tmp_path / "c")
    with pytest.raises(HeldBack, match=r"held back: partition \d's running maximum") as err:
        compact(CompactConfig(source=full_source, dest=url, groups=3, slice_duration="5s", max_held_back=0.01), spark)
    share = float(str(err.value).split("(")[1].split("%")[0]) / 100
    assert share > 0.01 and "more than --max-held-back 0.01" in str(err.value)
    assert not compacted.versions(open_storage(url))  # nothing committed
    print_compact_result(
        compact(CompactConfig(source=full_source, dest=url, groups=3, slice_duration="5s"), spark), False
    )
    out = capsys.readouterr().out
    assert "WARNING: " in out and f"({share:.1%} of this run's)" in out
