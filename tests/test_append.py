"""Appends (`keyfill compact --append`, docs/design.md, invariant 7): a source that grows in steps,
each appended as a new version, replays (across checkpoints taken on older versions) to
exactly the grown source, per-key order kept, no record made late that was not late in its
own partition (or counted as made late by --idle-after), watermarks monotone; and the
appended archive's slices are the one-shot compaction's."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_reader import check_invariants, hypothesis_settings, run, running_max_before, source_table

import reader
from compactor import job, lease
from compactor.errors import NothingSealed
from compactor.job import CompactConfig, compact
from compactor.sources import open_source
from compactor.sources.envelope import write_chunk
from compactor.verify import verify
from keyfill.cli import main
from keygroups import compacted
from keygroups.errors import OptionError
from keygroups.storage import open_storage
from tests.fault_injection import compact_dying_after
from tests.records import (
    archive_metas,
    below_handoff,
    check_sealed,
    copy_share,
    envelope_records,
    replayed,
    sealed_slices,
    source_positions,
)


@st.composite
def growing_source(draw):
    """Per partition: timestamps and keys in offset order (idle stretches, a hot key, null
    keys), and k+1 growth points: each step adds the records up to its point (a partition
    may lag or not grow at all in a step)."""
    keys = [None, b"hot"] + [b"k%d" % i for i in range(draw(st.integers(1, 10)))]
    k = draw(st.integers(1, 5))
    parts = {}
    for p in range(draw(st.integers(1, 4))):
        n = draw(st.integers(2, 60))
        steps = np.array(draw(st.lists(st.sampled_from([0, 1, 10, 500, 5_000, 30_000]), min_size=n, max_size=n)))
        ts = np.cumsum(steps) - np.array(draw(st.lists(st.integers(0, 8_000), min_size=n, max_size=n)))
        ks = [keys[i] for i in draw(st.lists(st.integers(0, len(keys) - 1), min_size=n, max_size=n))]
        ends = sorted(draw(st.lists(st.integers(1, n), min_size=k, max_size=k)))  # present from the start
        parts[p] = (ts.tolist(), ks, [*ends, n])
    return parts, draw(st.sampled_from(["1s", "10s", "1m"])), draw(st.sampled_from([None, "1m"]))


def grow(store, parts, written: dict[int, int], step: int) -> None:
    """Write each partition's records up to its point for `step`, as new chunk files (a
    chunk per step and partition, split in two where there are many)."""
    for p, (ts, ks, ends) in parts.items():
        a, b = written.get(p, 0), ends[step]
        for lo, hi in ((a, (a + b) // 2), ((a + b) // 2, b)) if b - a > 8 else ((a, b),):
            if hi > lo:
                write_chunk(store, envelope_records(p, range(lo, hi), ts[lo:hi], ks[lo:hi]), "t", codec="null")
        written[p] = b


def placed_late(url: str, src: str) -> set[tuple[int, int]]:
    """(partition, offset) of the records the archive at `url` placed after their own running
    maximum's slice, read from its index and the source."""
    store = open_storage(url)
    manifest = compacted.load_manifest(store)
    table = source_table(src)
    out = set()
    placed = {}
    for meta in archive_metas(store):
        for r in meta.partitions:
            for o in range(r.first_offset, r.last_offset + 1):
                placed[(r.partition, o)] = meta.slice
    parts = table.column("partition").to_numpy()
    for p in np.unique(parts).tolist():
        t = table.filter(pa.array(parts == p)).sort_by("offset")
        ts = t.column("timestamp").cast(pa.int64()).to_numpy()
        own = np.maximum.accumulate(ts) // manifest.slice_duration_ms - manifest.base
        for o, s in zip(t.column("offset").to_pylist(), own.tolist()):
            if (p, o) in placed and placed[(p, o)] > s:
                out.add((p, o))
    return out


def read_some(events, limit: int) -> list:
    got = []
    for ev in events:
        got.append(ev)
        if len(got) >= limit:
            break
    return got


@hypothesis_settings(20)
@given(case=growing_source(), data=st.data())
def test_an_appended_history_replays_as_the_grown_source_across_versions(tmp_path_factory, case, data):
    """Compacted and appended in process: the bytes Spark writes (test_in_process compares
    the two on an append), so a history costs seconds, not a Spark job per step."""
    parts, duration, idle = case
    root = tmp_path_factory.mktemp("append")
    src = open_storage(str(root / "src"))
    dest = str(root / "c")
    written: dict[int, int] = {}
    events, state, bound = [], None, data.draw(st.sampled_from([0, 2_000]))
    steps = len(next(iter(parts.values()))[2])
    committed = 0
    want = None  # what the history must hold, from the source alone (tests/records.py)
    for step in range(steps):
        grow(src, parts, written, step)
        last = step == steps - 1
        cfg = CompactConfig(
            source=src.url, dest=dest, groups=3, slice_duration=duration, idle_after=idle, append=True, seal_all=last
        )
        sealed = sealed_slices(
            source_positions(source_table(src.url)),
            cfg.slice_duration_ms,
            seal_all=last,
            idle_after_ms=cfg.idle_after_ms,
            after=want,
        )
        try:
            r = compact(cfg)
        except NothingSealed:
            assert sealed is None, f"step {step}: nothing sealed, yet the source seals {sealed}"
            continue
        assert sealed is not None, f"step {step}: version {r.version} committed, yet the source seals nothing new"
        want = sealed
        check_sealed(open_storage(dest), want)  # slices, hand-off, running maximum, each record's slice
        committed += 1
        assert r.version == committed and r.kind == ("compact" if committed == 1 else "append")
        report = verify(open_source(src.url), open_storage(dest))
        assert report.ok, report.violations
        # Read on from a checkpoint taken on an older version (the archive id is kept).
        with reader.replay(
            dest, threads=data.draw(st.integers(1, 16)), batch_size=7, watermark_bound_ms=bound, resume=state
        ) as ev:
            events += read_some(ev, data.draw(st.integers(1, 25)))
            state = ev.checkpoint()  # perhaps at this version's end: resumed on the next one
    with reader.replay(dest, threads=data.draw(st.integers(1, 16)), watermark_bound_ms=bound, resume=state) as ev:
        events += run(ev)[0]
    manifest = compacted.load_manifest(open_storage(dest))
    assert manifest.version == committed and [r for r in manifest.runs] and len(manifest.runs) == committed
    table = source_table(src.url)
    assert len(want.placed) == table.num_rows  # the last append sealed everything
    before = running_max_before(table)
    # made late: each record the archive placed after its own running maximum's slice is one the
    # source says an append had to place so (an idle or new partition's, lifted into the first
    # slice of the append that carried it), and no other
    late = placed_late(dest, src.url)
    assert late == want.made_late and len(late) == manifest.totals.made_late
    if idle is None:
        assert not late
    for key in late:  # allowed behind the watermark
        before[key] = (before[key][0], np.iinfo(np.int64).max)
    check_invariants(events, table, before, bound)
    if idle is None:  # invariant 7: the slices of the one-shot compaction of the grown source
        one = str(root / "one")
        compact(CompactConfig(source=src.url, dest=one, groups=3, slice_duration=duration, seal_all=True))
        got = [(m.slice, m.start_ms, m.records, m.partitions) for m in archive_metas(open_storage(dest))]
        want = [(m.slice, m.start_ms, m.records, m.partitions) for m in archive_metas(open_storage(one))]
        assert got == want


def test_an_append_keeps_groups_identity_and_the_old_version(spark, full_source, tmp_path, storage_url):
    src, dest = str(tmp_path / "src"), storage_url
    copy_share(full_source, src, 0.5)
    first = compact(CompactConfig(source=src, dest=dest, slice_duration="10s"), spark)
    store = open_storage(dest)
    v1 = compacted.load_manifest(store)
    old_files = {o.key: o.size for o in store.list("groups/")}
    copy_share(full_source, src, 1.0)
    r = compact(CompactConfig(source=src, dest=dest, append=True), spark)
    v2 = compacted.load_manifest(store)
    assert (r.kind, r.version, r.first_slice) == ("append", 2, v1.slices) and v2.slices > v1.slices
    assert (v2.archive, v2.groups, v2.slice_duration_ms, v2.parent) == (v1.archive, v1.groups, 10_000, 1)
    assert v2.runs == [*v1.runs, v2.run] and r.new_records == v2.totals.records - v1.totals.records
    assert r.new_records + first.records + r.withheld == 12_000
    # the old version's files are untouched, and it stays readable as it was
    assert {k: s for k, s in ((o.key, o.size) for o in store.list("groups/")) if k in old_files} == old_files
    assert compacted.load_manifest(store, 1) == v1
    from keygroups.assignment import load_assignment

    a2 = {(r["key"], r["null_key_partition"]): r["group"] for r in load_assignment(store, v2.assignment).to_pylist()}
    a1 = load_assignment(store, v1.assignment).to_pylist()
    assert all(a2[(r["key"], r["null_key_partition"])] == r["group"] for r in a1)  # existing keys stay
    assert len(a2) >= len(a1)
    assert verify(open_source(src), store).ok
    from compactor.verify.spark import verify_spark

    assert verify_spark(open_source(src), store, spark).ok
    # the append continued every group's small last file in a file of its own: still one
    # file per group, and version 1's files are what version 2 dropped
    assert set(v2.dropped) == set(old_files) and v2.totals.files == v2.groups == len(files_of(store, v2))
    # while version 1 may be read, vacuum keeps all; once it is out of the retention window,
    # vacuum removes what only it named: its version object, assignment, the index pair the
    # append rewrote, and the tails version 2 dropped
    from compactor.vacuum import plan_vacuum, vacuum

    assert plan_vacuum(store, retain_ms=3_600_000, now_ms=v2.created_ms + 10).files == []
    plan = plan_vacuum(store, retain_ms=1, now_ms=v2.created_ms + 10)
    assert plan.expired == [1] and set(plan.files) == {
        compacted.version_key(1),
        v1.assignment,
        *(f"index/{0:010d}-{v1.run}.{kind}.parquet" for kind in ("slices", "pieces")),
        *v2.dropped,
    }
    vacuum(store, plan)
    assert {o.key for o in store.list("groups/")} == files_of(store, v2)
    assert verify(open_source(src), store).ok


def files_of(store, manifest) -> set[str]:
    """The segment files a version's index names."""
    from keygroups.piece_index import PieceIndex

    return set(PieceIndex.of(store, manifest).piece_rows(0, manifest.slices).column("file").to_pylist())


def test_appends_continue_each_groups_small_last_file(spark, tmp_path):
    """Appends leave each group at most ceil(its file bytes / target) files, as a
    one-shot compaction would (small appends do not pile up small files); older versions'
    files stay until vacuum, and the last version verifies and replays whole."""
    from keyfill.synth.generate import GeneratorConfig, generate

    full, src, dest = str(tmp_path / "full"), str(tmp_path / "src"), str(tmp_path / "c")
    generate(
        GeneratorConfig(out=full, records=12_000, keys=300, partitions=3, chunk_records=400, skew=1.1, rate=100.0),
        progress=False,
    )
    target = 40_000
    copy_share(full, src, 0.2)
    cfg = dict(source=src, dest=dest, groups=4, slice_duration="10s", target_file_bytes=target)
    compact(CompactConfig(**cfg), spark)
    store = open_storage(dest)
    for step in range(2, 6):
        copy_share(full, src, step / 5)
        try:
            compact(CompactConfig(**{**cfg, "groups": None}, append=True), spark)
        except NothingSealed:  # a step whose chunks hold no new whole slice
            pass
    m = compacted.load_manifest(store)
    assert m.version >= 4 and verify(open_source(src), store).ok
    named = files_of(store, m)
    sizes = {o.key: o.size for o in store.list("groups/")}
    assert m.totals.files == len(named) and m.totals.file_bytes == sum(sizes[k] for k in named)
    for g in range(m.groups):
        mine = sorted((k for k in named if k.startswith(f"groups/{g:05d}/")), key=compacted.segment_first_slice)
        assert len(mine) <= max(1, -(-sum(sizes[k] for k in mine) // target)), (g, [sizes[k] for k in mine])
        assert all(sizes[k] >= target for k in mine[:-1])  # every file but the last is full
    assert any(compacted.load_manifest(store, v).dropped for v in range(2, m.version + 1))
    for v in range(1, m.version):  # a reader that opened an older version still finds all it names
        assert files_of(store, compacted.load_manifest(store, v)) <= set(sizes)
    with reader.replay(dest, threads=3) as ev:
        assert sum(e.batch.num_rows for e in ev if isinstance(e, reader.Records)) == m.totals.records


@pytest.mark.spark  # the CLI compacts on Spark
def test_an_append_refuses_a_tail_that_is_not_what_the_index_says(full_source, tmp_path):
    """The write task that meets the cut tail stops the run at once: one line naming the file,
    exit 2, no executor traceback on the terminal, and no attempt retried (local[2,4] tries a
    failed task 4 times, each failure logged as "Exception in task"); the task's traceback is
    kept in the run's error object, which the line names."""
    from test_cli import run as keyfill

    src, dest = str(tmp_path / "src"), str(tmp_path / "c")
    copy_share(full_source, src, 0.5)
    compact(CompactConfig(source=src, dest=dest, groups=2, slice_duration="10s"))  # in this process: one Spark run
    store = open_storage(dest)
    before = compacted.load_manifest(store)
    victim = sorted(o.key for o in store.list("groups/"))[0]
    store.write(victim, store.read(victim)[:-3])
    copy_share(full_source, src, 1.0)
    out = keyfill("compact", src, dest, "--append", "--master", "local[2,4]")
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 2 and last.startswith("keyfill compact: error: "), out.stderr
    assert re.search(f"{dest}/{victim}: \\d+ bytes, the index says \\d+", last), last
    assert sum(victim in line for line in out.stderr.splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr and "Exception in task" not in out.stderr, out.stderr
    (kept,) = [o.key for o in store.list(compacted.RUNS + "/") if o.key.endswith(".error.json")]
    assert last.endswith(f"{dest}/{kept}") and "Traceback" in json.loads(store.read(kept))["traceback"]
    assert compacted.versions(store) == [1] and compacted.load_manifest(store) == before


def test_tails_are_the_small_last_files_inside_the_rewritten_index_file():
    from compactor.append import tails
    from keygroups.piece_index import PIECE_SCHEMA

    def row(s, g, first, size):
        return dict(
            slice=s, group=g, file=compacted.segment_key(g, first, "0" * 16), offset=0, length=1, records=1,
            min_timestamp=0, max_timestamp=0, crc32c=0, file_header=50, file_bytes=size,
        )  # fmt: skip

    rows = pa.Table.from_pylist(
        [
            row(8, 0, 8, 100),  # group 0: an older full file, then a small one from slice 9
            row(9, 0, 9, 10),
            row(10, 0, 9, 10),
            row(9, 1, 3, 10),  # group 1: its last file starts before the index file (slice 8)
            row(10, 2, 8, 100),  # group 2: its last file is full
        ],
        schema=PIECE_SCHEMA,
    )
    got = tails(rows, 8, 100)
    assert list(got) == [0] and got[0].key == compacted.segment_key(0, 9, "0" * 16)
    assert (got[0].first_slice, got[0].file_bytes, got[0].file_header) == (9, 10, 50)
    assert tails(rows, 8, 101).keys() == {0, 2} and tails(rows.slice(0, 0), 8, 100) == {}

    # group 0's tail was continued by run r (its new file is among those written), group 2's
    # was not (no new records): only group 0's rows move, to the new file and its size
    from compactor.commit import repoint

    run = "1" * 16
    continued = tails(rows, 8, 101)
    written = pa.Table.from_pylist([{**row(11, 0, 9, 0), "file": compacted.segment_key(0, 9, run), "file_bytes": 77}])
    moved, dropped = repoint(rows, written.cast(PIECE_SCHEMA), continued, run)
    assert moved.schema == rows.schema and dropped == [continued[0]]
    want = [(r["file"], r["file_bytes"]) for r in rows.to_pylist()]
    want[1] = want[2] = (compacted.segment_key(0, 9, run), 77)
    assert [(r["file"], r["file_bytes"]) for r in moved.to_pylist()] == want
    assert repoint(rows, written.slice(0, 0).cast(PIECE_SCHEMA), continued, run) == (rows, [])


def test_a_killed_append_leaves_the_previous_version_and_a_rerun_commits(spark, full_source, tmp_path):
    """An append whose Spark rewrite tasks die after their first segment file. (Deaths at
    every other write, the index files and the version object among them, are drawn in
    tests/test_failed_runs.py, in process: that code runs on the driver either way.)"""
    src, dest = str(tmp_path / "src"), str(tmp_path / "c")
    copy_share(full_source, src, 0.4)
    compact(CompactConfig(source=src, dest=dest, groups=4, slice_duration="10s"), spark)
    store = open_storage(dest)
    before = compacted.load_manifest(store)
    held = below_handoff(source_table(src), dest)  # what version 1 must hold, from the source
    copy_share(full_source, src, 0.8)
    cfg = CompactConfig(source=src, dest=dest, append=True)
    with pytest.raises(Exception, match="injected failure"):
        compact_dying_after(cfg, spark)
    assert compacted.versions(store) == [1] and compacted.load_manifest(store) == before
    assert verify(open_source(src), store).ok  # version 1 against the grown source: still exact
    got = replayed(dest)
    assert len(got) == len(set(got)) and set(got) == set(
        zip(held.column("partition").to_pylist(), held.column("offset").to_pylist())
    )
    r = compact(CompactConfig(source=src, dest=dest, append=True), spark)
    assert r.version == 2 and verify(open_source(src), store).ok


def test_of_two_appends_racing_exactly_one_commits(spark, full_source, tmp_path, monkeypatch):
    src, dest = str(tmp_path / "src"), str(tmp_path / "c")
    copy_share(full_source, src, 0.5)
    compact(CompactConfig(source=src, dest=dest, groups=4, slice_duration="10s"), spark)
    copy_share(full_source, src, 1.0)
    store = open_storage(dest)
    rewrite = job.rewrite_groups
    cfg = CompactConfig(source=src, dest=dest, append=True)

    def rewrite_then_lose_the_race(*args, **kwargs):
        written = rewrite(*args, **kwargs)
        monkeypatch.setattr(job, "rewrite_groups", rewrite)
        # The rival sees this run's lease and would stop at once (lease.check_alone); here it
        # does not (as if the two had started on stores whose listings lagged): the commit decides.
        monkeypatch.setattr(lease, "check_alone", lambda *args: None)
        assert compact(cfg, spark).version == 2  # the rival append commits while this one writes
        return written

    monkeypatch.setattr(job, "rewrite_groups", rewrite_then_lose_the_race)
    with pytest.raises(compacted.CommitConflict, match="another compaction committed version 2"):
        compact(cfg, spark)
    assert compacted.versions(store) == [1, 2]
    report = verify(open_source(src), store)
    assert report.ok and report.records == compacted.load_manifest(store).totals.records


def test_a_quiet_partition_holds_sealing_back_unless_declared_idle(spark, tmp_path):
    """Partitions 0 and 1 move on; partition 2 stops at 30 s. An append seals nothing new
    (naming partition 2) until --idle-after declares it idle; its records that come later,
    behind the published slices, go into the next append's first slice, counted made late."""
    src, dest = open_storage(str(tmp_path / "src")), str(tmp_path / "c")
    minute = 60_000
    for p in (0, 1):
        write_chunk(
            src,
            envelope_records(p, range(40), [i * 3_000 for i in range(40)], [b"a%d" % (i % 5) for i in range(40)]),
            "t",
        )
    write_chunk(src, envelope_records(2, range(10), [i * 3_000 for i in range(10)], [b"q"] * 10), "t")
    cfg = dict(source=src.url, dest=dest, groups=2, slice_duration="10s")
    first = compact(CompactConfig(**cfg), spark)
    assert first.slices == 2  # partition 2's running maximum (27 s) is in slice 2: slices 0, 1 are sealed
    for p in (0, 1):
        write_chunk(src, envelope_records(p, range(40, 80), [i * 3_000 for i in range(40, 80)], [b"a1"] * 40), "t")
    with pytest.raises(NothingSealed, match="partition 2.*--idle-after"):
        compact(CompactConfig(**cfg, append=True), spark)
    r = compact(CompactConfig(**cfg, append=True, idle_after="1m"), spark)
    assert r.idle == [2] and r.made_late == 0 and r.slices == 23  # partitions 0 and 1 reach 237 s
    # partition 2 wakes up with records of 30..40 s, long published: made late, into slice 23
    write_chunk(src, envelope_records(2, range(10, 14), [30_000, 33_000, 36_000, 4 * minute], [b"q"] * 4), "t")
    for p in (0, 1):
        write_chunk(src, envelope_records(p, range(80, 100), [i * 3_000 for i in range(80, 100)], [b"a2"] * 20), "t")
    r = compact(CompactConfig(**cfg, append=True, idle_after="1m"), spark)
    assert r.made_late == 3 and r.first_slice == 23
    store = open_storage(dest)
    manifest = compacted.load_manifest(store)
    assert manifest.totals.made_late == 3
    placed = {(r.partition, r.first_offset): m.slice for m in archive_metas(store) for r in m.partitions}
    assert placed[(2, 10)] == 23
    report = verify(open_source(src.url), store)
    assert report.ok, report.violations


def test_append_refuses_what_it_cannot_continue(spark, full_source, tmp_path, capsys):
    src, dest = str(tmp_path / "src"), str(tmp_path / "c")
    copy_share(full_source, src, 0.5)
    compact(CompactConfig(source=src, dest=dest, groups=4, slice_duration="10s"), spark)
    with pytest.raises(OptionError, match="--groups 5: an append keeps the archive's 4 groups"):
        compact(CompactConfig(source=src, dest=dest, groups=5, append=True), spark)
    with pytest.raises(OptionError, match="--slice-duration 1h: an append keeps the archive's slices of 10s"):
        compact(CompactConfig(source=src, dest=dest, slice_duration="1h", append=True), spark)
    with pytest.raises(OptionError, match="--append and --overwrite"):
        CompactConfig(source=src, dest=dest, append=True, overwrite=True)
    other = str(tmp_path / "other")
    copy_share(full_source, other, 1.0)
    with pytest.raises(OptionError, match=f"compacted from {src}.*not {other}"):
        compact(CompactConfig(source=other, dest=dest, append=True), spark)
    sealed = str(tmp_path / "sealed")
    compact(CompactConfig(source=src, dest=sealed, groups=4, slice_duration="10s", seal_all=True), spark)
    with pytest.raises(OptionError, match="--seal-all"):
        compact(CompactConfig(source=src, dest=sealed, append=True), spark)
    assert compacted.versions(open_storage(dest)) == [1]
    copy_share(full_source, src, 1.0)
    capsys.readouterr()
    assert main(["compact", src, dest, "--append"]) == 0  # the command, on this session
    assert "appended" in capsys.readouterr().out
    assert main(["compact", src, dest, "--append"]) == 2  # nothing new since
    assert "no new slice is sealed" in capsys.readouterr().err
    assert compacted.versions(open_storage(dest)) == [1, 2]
