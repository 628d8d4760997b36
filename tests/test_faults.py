"""The fault suite: damage and bad input injected where users meet them, each expected to end
in a clear error naming the object at fault, with nothing lost and nothing wrong delivered.

- overwrite from a bad source (missing, overlapping, corrupt): the previous archive stays
  and still verifies;
- source and destination inside one another: refused before anything is touched;
- overwrite next to files keyfill did not write: they stay;
- a flipped byte in a piece of a null-codec segment file, a segment swapped for another
  group's, a missing or truncated segment, an index row past the end of its file: the replay
  and the Spark source fail fast naming file, byte range, slice and group, emit nothing of
  the piece, and a replay resumed from its checkpoint after repair is exactly once;
- a frozen S3 endpoint (SIGSTOP on a SeaweedFS of its own): replay, verify and compact fail
  in bounded time naming endpoint and object; Ctrl-C ends a stalled replay at once; frozen
  mid-run, verify exits 2 (not a failed check) and compact names the read that hung, not the
  run's own records, whose writing waits a short bound and never replaces the error;
- verify of an unreadable manifest, a corrupt checkpoint file, a negative watermark bound.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from contextlib import contextmanager

import pyarrow as pa
import pytest

import reader
from compactor.job import CompactConfig, compact
from compactor.sources import open_source
from compactor.sources.envelope import write_chunk
from compactor.verify import CHECKS, verify
from keyfill.cli import main
from keyfill.synth.generate import GeneratorConfig, generate
from keyfill.testing.s3server import S3Server, start_seaweedfs
from keyfill.testing.servers import ScratchServer, use_env
from keygroups import compacted
from keygroups.errors import KeyfillError
from keygroups.storage import StorageError, open_storage
from tests.records import archive_metas, below_handoff, envelope_records, rewrite_index
from tests.waits import connected_to, wait_until

pytestmark = pytest.mark.faults

# Short limits for the frozen-endpoint cases, so each takes seconds; the defaults (5 s
# connect, 20 s read, 60 s deadline) are measured in the closing note instead.
SHORT_LIMITS = {"KEYFILL_S3_CONNECT_TIMEOUT": "1", "KEYFILL_S3_READ_TIMEOUT": "2", "KEYFILL_S3_DEADLINE": "5"}
# What a frozen-endpoint case may take under those limits: a request gives up within its 5 s
# deadline (plus a 2 s read in flight), a command adds Python's and keyfill's start-up (2-4 s
# here). A liveness bound, not a speed claim: the defaults would take 60 s and more, a hang
# forever. Measured 4.5-7.0 s per case on the idle 2-core box (each test prints its time); a
# whole case took up to 18 s beside two CPU burners and other runs (load 12-15), close to the
# old bound of 30 s. This one is well above that and still below the defaults' 60 s.
FROZEN_BOUND_S = 45
# Ctrl-C ends a stalled replay "at once": well under a second idle. Without it the replay
# would wait out its 60 s read timeout; the bound allows a busy machine its slowness.
CTRL_C_BOUND_S = 20


def snapshot(url: str) -> dict[str, bytes]:
    store = open_storage(url)
    return {o.key: store.read(o.key) for o in store.list()}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    src = str(tmp_path_factory.mktemp("faults") / "src")
    generate(
        GeneratorConfig(
            out=src,
            records=12_000,
            keys=200,
            partitions=3,
            chunk_records=2_000,
            skew=1.1,
            null_keys=0.02,
            headers=True,
            rate=200.0,
            seed=11,
            codec="null",
        ),
        progress=False,
    )
    return src


@pytest.fixture(scope="module")
def archive(spark, source, tmp_path_factory):
    """A null-codec archive (so one changed byte can decode cleanly) of several slices."""
    dest = str(tmp_path_factory.mktemp("faults") / "c")
    compact(CompactConfig(source=source, dest=dest, groups=4, slice_duration="20s", codec="null"), spark)
    return dest


def by_position(table: pa.Table) -> dict[tuple[int, int], dict]:
    return {(r["partition"], r["offset"]): r for r in table.to_pylist()}


def source_records(url: str, archive: str) -> dict[tuple[int, int], dict]:
    """The source's records that `archive` holds (those below its hand-off), by position."""
    src = open_source(url)
    return by_position(below_handoff(pa.Table.from_batches([src.read(c) for c in src.list_chunks()]), archive))


# --- overwrite and destinations ----------------------------------------------------------


def overlapping_source(root) -> str:
    src = open_storage(str(root / "overlap-src"))
    write_chunk(src, envelope_records(0, range(0, 10), range(10), [b"a"] * 10), "payments")
    write_chunk(src, envelope_records(0, range(5, 15), range(5, 15), [b"b"] * 10), "payments")
    return src.url


def corrupt_source(root, good: str) -> str:
    bad = root / "corrupt-src"
    shutil.copytree(good, bad)
    victim = sorted(p for p in bad.rglob("*") if p.is_file())[2]
    victim.write_bytes(victim.read_bytes()[:-500])
    return str(bad)


@pytest.mark.parametrize("bad", ["missing", "overlapping", "corrupt"])
def test_overwrite_from_a_bad_source_keeps_the_previous_archive(spark, source, archive, tmp_path, bad):
    dest = str(tmp_path / "c")
    shutil.copytree(archive, dest)
    before = snapshot(dest)
    bad_url = {
        "missing": lambda: str(tmp_path / "no-such-source"),
        "overlapping": lambda: overlapping_source(tmp_path),
        "corrupt": lambda: corrupt_source(tmp_path, source),
    }[bad]()
    with pytest.raises(KeyfillError) as err:  # a bad chunk found inside a Spark task: raised as the task raised it
        compact(CompactConfig(source=bad_url, dest=dest, groups=3, slice_duration="10s", overwrite=True), spark)
    assert bad_url in str(err.value)
    after = snapshot(dest)
    added = set(after) - set(before)  # nothing deleted, nothing half-written: the failed run's lease and error only
    assert {k: after[k] for k in before} == before and all(compacted.run_of(k) for k in added)
    assert {k.split("/")[0] for k in added} <= {compacted.RUNS} and len({compacted.run_of(k)[0] for k in added}) <= 1
    assert verify(open_source(source), open_storage(dest)).ok


def test_nested_source_and_destination_are_refused_before_anything_is_touched(spark, source, archive, tmp_path):
    nest = tmp_path / "nest"
    shutil.copytree(archive, nest)
    shutil.copytree(source, nest / "raw")
    (nest / "notes").mkdir()
    (nest / "notes" / "important.csv").write_text("do not delete\n")
    before = snapshot(str(nest))
    with pytest.raises(StorageError, match="overlap"):
        compact(CompactConfig(source=str(nest / "raw"), dest=str(nest), groups=3, overwrite=True), spark)
    with pytest.raises(StorageError, match="overlap"):  # the other way round
        compact(CompactConfig(source=str(nest / "raw"), dest=str(nest / "raw" / "compacted"), groups=3), spark)
    with pytest.raises(StorageError, match="overlap"):  # the same place under another spelling
        compact(CompactConfig(source=str(nest / "raw"), dest=f"file://{nest}/raw/", groups=3), spark)
    assert snapshot(str(nest)) == before


def test_overwrite_builds_a_new_version_beside_the_old_and_keeps_foreign_files(spark, source, archive, tmp_path):
    dest = tmp_path / "c"
    shutil.copytree(archive, dest)
    (dest / "notes").mkdir()
    (dest / "notes" / "important.csv").write_text("keep me\n")
    (dest / "README.txt").write_text("team archive\n")
    store = open_storage(str(dest))
    before = compacted.load_manifest(store)
    old = {k: v for k, v in snapshot(str(dest)).items() if compacted.is_archive_key(k)}
    r = compact(CompactConfig(source=source, dest=str(dest), groups=2, slice_duration="1m", overwrite=True), spark)
    assert r.groups == 2 and r.version == before.version + 1
    assert (dest / "notes" / "important.csv").read_text() == "keep me\n"
    assert (dest / "README.txt").read_text() == "team archive\n"
    after = compacted.load_manifest(store)
    assert after.parent == before.version and after.archive != before.archive  # 4 groups, 20 s slices before
    listed = {after.assignment} | {p.file for m in archive_metas(store) for p in m.pieces}
    assert all(after.run in k for k in listed)
    now = snapshot(str(dest))
    assert all(now[k] == v for k, v in old.items())  # the old version's files are untouched ...
    old_version = compacted.load_manifest(store, before.version)  # ... and it is still whole
    assert old_version == before
    assert verify(open_source(source), store).ok


def test_overlap_is_judged_on_both_backends():
    from keygroups.storage import overlapping

    s3 = lambda u: open_storage(u)  # noqa: E731 - no request is made
    assert overlapping(s3("s3://b/archive"), s3("s3://b/archive/compacted"))
    assert overlapping(s3("s3://b/archive/compacted/"), s3("s3://b/archive"))
    assert overlapping(s3("s3://b/archive"), s3("s3://b/archive/"))
    assert overlapping(s3("s3://b"), s3("s3://b/x"))
    assert not overlapping(s3("s3://b/archive"), s3("s3://b/archive-compacted"))
    assert not overlapping(s3("s3://b/archive"), s3("s3://c/archive"))
    assert not overlapping(s3("s3://b/tmp/x"), open_storage("/tmp/x"))


# --- the replay and the Spark source check what they deliver -----------------------------


# how errors name a piece: file, byte range, slice and group
WHERE = re.compile(r"(?P<file>\S+) bytes (?P<start>\d+)\.\.(?P<end>\d+) \(slice (?P<slice>\d+), group (?P<group>\d+)\)")
DAMAGE = ["flipped byte", "swapped file", "missing file", "truncated file", "index row past the end"]


def damage_piece(store, kind: str):
    """Damage the largest piece of slice 1 as `kind` says; the piece as the index had it."""

    from keygroups import piece_index

    metas = archive_metas(store)
    victim = max(metas[1].pieces, key=lambda p: p.records)
    if kind == "flipped byte":
        data = store.read(victim.file)
        at = data.index(b'"amount":', victim.offset) + len(b'"amount":')
        digit = data[at : at + 1]
        store.write(victim.file, data[:at] + (b"9" if digit != b"9" else b"1") + data[at + 1 :])
    elif kind == "swapped file":  # another group's segment put in its place
        other = next(p.file for m in metas for p in m.pieces if p.group != victim.group)
        store.write(victim.file, store.read(other))
    elif kind == "missing file":
        store.delete(victim.file)
    elif kind == "truncated file":
        store.write(victim.file, store.read(victim.file)[: victim.offset + 10])
    else:  # the index points past the end of the file
        rows = [p if p != victim else p._replace(offset=p.file_bytes + 100) for m in metas for p in m.pieces]
        rewrite_index(store, piece_index.slice_table(metas), piece_index.piece_table(rows))
    return victim


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_piece_fails_the_replay_names_it_and_a_resume_is_exactly_once(source, archive, tmp_path, damage):
    dest = str(tmp_path / "c")
    shutil.copytree(archive, dest)
    store = open_storage(dest)
    pristine = {o.key: store.read(o.key) for o in store.list()}
    victim = damage_piece(store, damage)
    truth = source_records(source, archive)
    delivered = []
    started = time.monotonic()
    with pytest.raises(reader.ReplayError) as err:
        with reader.replay(dest, threads=3, batch_size=500) as events:
            try:
                for ev in events:
                    if isinstance(ev, reader.Records):
                        delivered.append(ev)
            finally:
                state = events.checkpoint()
    assert time.monotonic() - started < 30  # fails fast, no hang
    message = str(err.value)
    named = WHERE.search(message)  # a damaged file fails at the first of its pieces found wrong
    assert named and named["file"].endswith(victim.file) and int(named["group"]) == victim.group, message
    if damage in ("flipped byte", "truncated file"):  # the pieces before the damage were fine
        assert named.group(0).endswith(
            f"{victim.file} bytes {victim.offset}..{victim.end} (slice 1, group {victim.group})"
        )
    assert not [ev for ev in delivered if (ev.slice, ev.group) == (victim.slice, victim.group)]
    for ev in delivered:  # what did arrive is the source's records, unchanged
        for r in ev.batch.drop_columns(["key_group"]).to_pylist():
            assert truth[(r["partition"], r["offset"])] == r
    for key, data in pristine.items():  # repaired: the replay resumes where it failed
        store.write(key, data)
    with reader.replay(dest, threads=5, resume=state) as events:
        delivered += [ev for ev in events if isinstance(ev, reader.Records)]
    got = [r for ev in delivered for r in ev.batch.drop_columns(["key_group"]).to_pylist()]
    seen = [(r["partition"], r["offset"]) for r in got]
    assert len(seen) == len(set(seen)) and set(seen) == set(truth)  # nothing twice, nothing lost
    assert all(truth[(r["partition"], r["offset"])] == r for r in got)  # each the source's record


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_piece_fails_the_spark_source_naming_it(spark, archive, tmp_path, damage):
    import reader.spark

    dest = str(tmp_path / "c")
    shutil.copytree(archive, dest)
    store = open_storage(dest)
    victim = damage_piece(store, damage)
    reader.spark.register(spark)
    with pytest.raises(Exception) as err:
        spark.read.format("keyfill").load(dest).count()
    named = WHERE.search(str(err.value))
    assert named and named["file"].endswith(victim.file) and int(named["group"]) == victim.group, str(err.value)


def test_replay_checks_cost_no_correctness(archive, source):
    """The check runs on every file and accepts every intact one (the whole archive replays)."""
    truth = source_records(source, archive)
    seen = []
    with reader.replay(archive, threads=2) as events:
        for ev in events:
            if isinstance(ev, reader.Records):
                seen += ev.batch.drop_columns(["key_group"]).to_pylist()
    assert len(seen) == len(truth) and {(r["partition"], r["offset"]): r for r in seen} == truth


# --- a frozen S3 endpoint ----------------------------------------------------------------


@pytest.fixture(scope="module")
def frozen_s3(archive, source):
    """A SeaweedFS of its own (the shared one must keep answering), holding a copy of the
    archive; tests freeze it with SIGSTOP and thaw it afterwards."""
    server = start_seaweedfs()
    env = {k: v for k, v in server.env().items()}
    saved = dict(os.environ)
    try:
        server.apply_env()
        url = f"s3://{server.bucket}/archive"
        store = open_storage(url)
        local = open_storage(archive)
        for o in local.list():
            store.write(o.key, local.read(o.key))
        yield server, url, env
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.stop()


@contextmanager
def frozen(server: ScratchServer):
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


def fault_env(env: dict, **extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in env}
    out.update({k: v for k, v in env.items() if v is not None})
    out.update(SHORT_LIMITS, **extra)
    return out


@pytest.fixture
def short_limits(frozen_s3, monkeypatch):
    server, url, env = frozen_s3
    for k, v in fault_env(env).items():
        monkeypatch.setenv(k, v)
    return server, url


def replay_command_frozen(server: ScratchServer, url: str, env: dict[str, str]) -> tuple[str, float]:
    """`keyfill replay url` against the frozen server: its one error line, and how long it took."""
    with frozen(server):
        started = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "keyfill", "replay", url, "--no-progress"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - started
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0], took


def test_frozen_endpoint_fails_the_replay_command_in_bounded_time(frozen_s3):
    server, url, env = frozen_s3
    line, took = replay_command_frozen(server, url, fault_env(env))
    assert server.endpoint in line and f"{url}/{compacted.VERSIONS}" in line
    assert took < FROZEN_BOUND_S, f"{took:.1f} s"
    print(f"frozen endpoint, replay command: error after {took:.1f} s")


REPLAY_SCRIPT = """
import sys, reader
events = reader.replay(sys.argv[1], threads=4, read_ahead_bytes=1 << 16)
print("opened", flush=True)
sys.stdin.readline()
try:
    print("reading", flush=True)
    with events:
        for ev in events:
            pass
except reader.ReplayError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)
except KeyboardInterrupt:
    sys.exit(130)
"""


def start_replay_then_freeze(server: S3Server, url: str, env: dict, **limits: str) -> subprocess.Popen:
    """A replay whose manifest is read; its threads then meet a frozen endpoint."""
    proc = subprocess.Popen(
        [sys.executable, "-c", REPLAY_SCRIPT, url],
        env=fault_env(env, **limits),
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout.readline().strip() == "opened"
    os.kill(server.process.pid, signal.SIGSTOP)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "reading"  # Ctrl-C from here is the replay's to handle
    return proc


def test_frozen_endpoint_fails_replay_threads_in_bounded_time(frozen_s3):
    server, url, env = frozen_s3
    try:
        proc = start_replay_then_freeze(server, url, env)
        started = time.monotonic()
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - started
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    assert proc.returncode == 2, err
    assert server.endpoint in err and url in err
    assert took < FROZEN_BOUND_S, f"{took:.1f} s"
    print(f"frozen endpoint, replay threads: error after {took:.1f} s")


def test_ctrl_c_stops_a_stalled_replay_at_once(frozen_s3):
    server, url, env = frozen_s3
    try:
        # Long limits here: only Ctrl-C may end this replay.
        proc = start_replay_then_freeze(server, url, env, KEYFILL_S3_READ_TIMEOUT="60", KEYFILL_S3_DEADLINE="300")
        time.sleep(1.5)  # the threads meet the frozen endpoint (Ctrl-C must stop them wherever they are)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        proc.communicate(timeout=60)
        took = time.monotonic() - started
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    assert proc.returncode == 130
    assert took < CTRL_C_BOUND_S, f"Ctrl-C took {took:.1f} s"
    print(f"Ctrl-C during a stalled replay: exited after {took:.2f} s")


def test_ctrl_c_stops_the_replay_command_stalled_on_its_manifest(frozen_s3):
    server, url, env = frozen_s3
    with frozen(server):
        proc = subprocess.Popen(
            [sys.executable, "-m", "keyfill", "replay", url, "--no-progress"],
            env=fault_env(env, KEYFILL_S3_READ_TIMEOUT="60", KEYFILL_S3_DEADLINE="300"),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        # started, and waiting for the manifest (not still importing keyfill, whose start-up a
        # busy machine stretches past any fixed sleep)
        port = urllib.parse.urlparse(server.endpoint).port
        wait_until(lambda: connected_to(proc.pid, port), "the command waiting on the frozen server")
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - started
    assert proc.returncode == 130 and "interrupted" in err
    assert took < CTRL_C_BOUND_S, f"Ctrl-C took {took:.1f} s"


def test_frozen_endpoint_fails_verify_in_bounded_time(frozen_s3, short_limits, source, capsys):
    server, url = short_limits
    with frozen(server):
        started = time.monotonic()
        assert main(["verify", source, url, "--no-progress"]) == 2
        took = time.monotonic() - started
    assert took < FROZEN_BOUND_S, f"{took:.1f} s"
    err = capsys.readouterr().err
    assert server.endpoint in err and url in err


def test_frozen_endpoint_fails_compact_in_bounded_time(spark, frozen_s3, short_limits, source):
    server, url = short_limits
    with frozen(server):
        started = time.monotonic()
        with pytest.raises(StorageError) as err:
            compact(CompactConfig(source=source, dest=f"s3://{server.bucket}/new", groups=2), spark)
        took = time.monotonic() - started
    print(f"frozen endpoint, compact: error after {took:.1f} s")
    assert took < FROZEN_BOUND_S, f"{took:.1f} s"
    assert server.endpoint in str(err.value) and f"s3://{server.bucket}/new" in str(err.value)


def test_verify_frozen_mid_audit_is_an_unreadable_archive_not_a_failed_check(short_limits, source, capsys, monkeypatch):
    """The store freezes once the audit has read the manifest, the index and the assignment:
    the segment reads that hang end it as "could not be read" (exit 2, one line naming the
    request), not as a failed check ("NOT verified", exit 1): nothing is wrong with the archive."""
    import compactor.verify.checks

    server, url = short_limits

    class FreezingChecker(compactor.verify.checks.FileChecker):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            os.kill(server.process.pid, signal.SIGSTOP)

    monkeypatch.setattr(compactor.verify.checks, "FileChecker", FreezingChecker)
    try:
        started = time.monotonic()
        code = main(["verify", source, url, "--no-progress"])
        took = time.monotonic() - started
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    out, err = capsys.readouterr()
    print(f"frozen mid-audit, verify: exit {code} after {took:.1f} s")
    assert code == 2 and "NOT verified" not in out and "FAIL" not in out, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and server.endpoint in lines[0] and f"{url}/{compacted.GROUPS}/" in lines[0], err
    assert took < FROZEN_BOUND_S, f"{took:.1f} s"


@pytest.fixture(scope="module")
def s3_source(frozen_s3, source):
    """The fault source, copied to the frozen-endpoint server."""
    server, _, _ = frozen_s3
    url = f"s3://{server.bucket}/src"
    remote, local = open_storage(url), open_storage(source)
    for o in local.list():
        remote.write(o.key, local.read(o.key))
    return url


def test_compact_frozen_mid_run_names_the_read_that_hung(spark, frozen_s3, short_limits, s3_source, monkeypatch):
    """The store freezes as the statistics pass starts: the run fails once, within one
    request's bound, naming the source read that hung; not the run's error object, which the
    driver looks for while tasks run and which cannot be read either."""
    import compactor.job

    server, _ = short_limits
    _, _, env = frozen_s3
    # Spark's Python workers take their environment from the session, not from os.environ
    for k, v in {**{k: v for k, v in env.items() if v is not None}, **SHORT_LIMITS}.items():
        monkeypatch.setitem(spark.sparkContext.environment, k, v)
    statistics = compactor.job.statistics_pass

    def freezing(*args, **kwargs):
        os.kill(server.process.pid, signal.SIGSTOP)
        return statistics(*args, **kwargs)

    monkeypatch.setattr(compactor.job, "statistics_pass", freezing)
    try:
        started = time.monotonic()
        with pytest.raises(StorageError) as err:
            compact(CompactConfig(source=s3_source, dest=f"s3://{server.bucket}/mid", groups=2), spark)
        took = time.monotonic() - started
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    message = str(err.value)
    print(f"frozen mid-run, compact: error after {took:.1f} s: {message}")
    assert "\n" not in message and server.endpoint in message and f"{s3_source}/" in message, message
    assert f"/{compacted.RUNS}/" not in message, message
    assert took < FROZEN_BOUND_S, f"{took:.1f} s"


def test_recording_an_error_waits_a_short_bound_and_never_replaces_it(tmp_path, monkeypatch):
    """A store that stops answering holds neither a task's report of its error nor the run's
    release of its lease for more than `RECORD_S`; the task's error is then raised as it was."""
    import compactor.lease
    from compactor.task_errors import TaskErrors

    monkeypatch.setattr(compactor.lease, "RECORD_S", 0.5)
    store = open_storage(str(tmp_path))
    lease = compactor.lease.Lease(store, compacted.new_run(), "compact").acquire()
    answer = threading.Event()
    monkeypatch.setattr(store, "write", lambda *args, **kwargs: answer.wait(60))
    monkeypatch.setattr(store, "create", lambda *args, **kwargs: answer.wait(60))

    def task(batches):
        raise compacted.FormatError("groups/00000/x.avro: 1 bytes, the index says 2")
        yield

    try:
        started = time.monotonic()
        with pytest.raises(compacted.FormatError, match="the index says 2"):
            list(TaskErrors(store, lease.record.run).guard(task)(iter([])))
        lease.release(failed=True)
        took = time.monotonic() - started
    finally:
        answer.set()
    # two waits of RECORD_S (0.5 s here) idle; the store's writes would hold it 60 s each
    assert took < 15, f"{took:.1f} s"


# --- smaller bad inputs ------------------------------------------------------------------


def test_verify_of_an_unreadable_manifest_reports_checks_not_run(source, archive, tmp_path, capsys):
    dest = tmp_path / "c"
    shutil.copytree(archive, dest)
    (dest / compacted.version_key(compacted.load_manifest(open_storage(str(dest))).version)).write_text("{ not json")
    report = verify(open_source(source), open_storage(str(dest)))
    assert not report.ok and set(report.skipped) == set(CHECKS) - {"manifest"}
    assert main(["verify", source, str(dest), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "FAIL manifest" in out and "unreadable manifest" in out
    assert not [line for line in out.splitlines() if line.startswith("ok")]
    assert sum(line.startswith("skip") for line in out.splitlines()) == len(CHECKS) - 1


@pytest.mark.parametrize(
    "content",
    [
        "",
        "{ half",
        '["a list"]',
        '{"version": 1, "slices": 0}',
        '{"version": 1, "slices": SLICES, "slice": "x"}',
        '{"version": 1, "slices": SLICES, "slice": 999}',
    ],
)
def test_a_bad_checkpoint_file_is_named(archive, tmp_path, capsys, content):
    slices = compacted.load_manifest(open_storage(archive)).slices
    path = tmp_path / "ck.json"
    path.write_text(content.replace("SLICES", str(slices)))
    assert main(["replay", archive, "--checkpoint-file", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err
    assert path.read_text() == content.replace("SLICES", str(slices))  # left for the user to inspect


def test_negative_bounds_are_refused(archive, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["replay", archive, "--watermark-bound-ms", "-5000"])
    assert exit_.value.code == 2 and "--watermark-bound-ms" in capsys.readouterr().err
    with pytest.raises(ValueError, match="watermark_bound_ms"):
        reader.replay(archive, watermark_bound_ms=-1)
    with pytest.raises(SystemExit):
        main(["replay", archive, "--max-drift-ms", "-1"])


def test_a_foreign_file_named_like_an_archive_file_is_not_cleared(spark, source, tmp_path):
    dest = tmp_path / "c"
    dest.mkdir()
    (dest / "assignment.parquet").write_bytes(b"the team's own table")
    with pytest.raises(StorageError, match="assignment.parquet"):
        compact(CompactConfig(source=source, dest=str(dest), groups=2), spark)
    assert (dest / "assignment.parquet").read_bytes() == b"the team's own table"


# --- frozen GCS and Azure endpoints ---------------------------------------------------------


@pytest.mark.parametrize("store", ["gcs", "azure"])
def test_a_frozen_gcs_or_azure_endpoint_fails_the_replay_command_in_bounded_time(archive, store):
    """The same bound on every store: an emulator of its own, frozen once the archive is on
    it, and `keyfill replay` ends in one line naming the archive's URL (KEYFILL_STORAGE_*)."""
    from keyfill.testing.azurite import start_azurite
    from keyfill.testing.gcsserver import start_fake_gcs

    server = start_fake_gcs() if store == "gcs" else start_azurite()
    with server, server.applied_env():
        url = f"gs://{server.bucket}/archive" if store == "gcs" else f"az://{server.container}/archive"
        remote, local = open_storage(url), open_storage(archive)
        for o in local.list():
            remote.write(o.key, local.read(o.key))
        env = {**os.environ, "KEYFILL_STORAGE_CONNECT_TIMEOUT": "1", "KEYFILL_STORAGE_READ_TIMEOUT": "2"}
        line, took = replay_command_frozen(server, url, {**env, "KEYFILL_STORAGE_DEADLINE": "5"})
    assert url in line, line
    assert took < FROZEN_BOUND_S, f"{took:.1f} s"
    print(f"frozen {store} endpoint, replay command: error after {took:.1f} s: {line}")


@pytest.mark.parametrize("backend", ["s3", "gcs", "azure"])
def test_responses_cut_short_under_a_replay_are_fetched_again_each_record_once(
    request, archive, source, monkeypatch, backend
):
    """The network resets the first responses of a replay partway through their bodies
    (a FaultProxy in front of the emulator): each is fetched again, and the replay delivers
    the archive's records, each once, nothing decoded from a short body."""
    from keyfill.testing.tcp_proxy import in_front_of

    server = request.getfixturevalue(f"{backend}_server")
    url = request.getfixturevalue(f"{backend}_url")
    # this server's variables: this module's frozen_s3 fixture points the process at its own
    # SeaweedFS (same bucket name) while it lives
    use_env(monkeypatch, server.env())
    remote, local = open_storage(url), open_storage(archive)
    for o in local.list():
        remote.write(o.key, local.read(o.key))
    proxy, env = in_front_of(server)
    with proxy:
        use_env(monkeypatch, env)
        got = []
        with reader.replay(url, threads=3) as events:
            # the next two responses past 20 KB, the pieces' spans; a store gives up on an object
            # after its third cut body (S3, Azure)
            proxy.cut(20_000, "reset", times=2)
            for ev in events:
                if isinstance(ev, reader.Records):
                    got += zip(ev.batch.column("partition").to_pylist(), ev.batch.column("offset").to_pylist())
        assert proxy.cuts_left == 0  # every cut was met
    assert len(got) == len(set(got)) and set(got) == set(source_records(source, archive))
