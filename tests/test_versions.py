"""Versioned commits (docs/design.md, "version"): every compaction publishes a new version in one
create-only step; readers keep the version they opened; a failed or losing run leaves the
previous version as it was."""

from __future__ import annotations

import json

import pytest

import reader
from compactor import job, lease
from compactor.job import CompactConfig, compact
from compactor.sources import open_source
from compactor.vacuum import plan_vacuum as vacuum_plan
from compactor.vacuum import vacuum as vacuum_files
from compactor.verify import verify
from keyfill.cli import main
from keyfill.synth.generate import GeneratorConfig, generate
from keygroups import compacted
from keygroups.storage import open_storage
from tests.fault_injection import compact_dying_after


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    src = str(tmp_path_factory.mktemp("versions") / "src")
    generate(
        GeneratorConfig(
            out=src, records=6_000, keys=150, partitions=3, chunk_records=1_000, skew=1.0, rate=100.0, seed=5
        ),
        progress=False,
    )
    return src


def keys_of(events) -> list[tuple[int, int]]:
    return [
        (p, o)
        for ev in events
        if isinstance(ev, reader.Records)
        for p, o in zip(ev.batch.column("partition").to_pylist(), ev.batch.column("offset").to_pylist())
    ]


def source_keys(src: str) -> list[tuple[int, int]]:
    source = open_source(src)
    out = []
    for chunk in source.list_chunks():
        batch = source.read(chunk)
        out += zip(batch.column("partition").to_pylist(), batch.column("offset").to_pylist())
    return sorted(out)


def test_a_reader_keeps_the_version_it_opened_while_an_overwrite_commits(spark, source, tmp_path):
    dest = str(tmp_path / "c")
    compact(CompactConfig(seal_all=True, source=source, dest=dest, groups=4, slice_duration="20s"), spark)
    with reader.replay(dest, threads=3, batch_size=50, queue_batches=2) as events:
        it = iter(events)
        first = [next(it) for _ in range(5)]
        assert events.manifest.version == 1
        r = compact(
            CompactConfig(seal_all=True, source=source, dest=dest, groups=2, slice_duration="1m", overwrite=True), spark
        )
        assert r.version == 2
        rest = list(it)
    got = keys_of(first + rest)
    assert sorted(got) == source_keys(source) and len(set(got)) == len(got)  # version 1, whole, once
    latest = compacted.load_manifest(open_storage(dest))
    assert (latest.version, latest.groups, latest.parent) == (2, 2, 1)


def test_a_failed_overwrite_leaves_the_previous_version_and_a_rerun_commits(spark, source, tmp_path):
    dest = str(tmp_path / "c")
    compact(CompactConfig(seal_all=True, source=source, dest=dest, groups=3, slice_duration="30s"), spark)
    store = open_storage(dest)
    before = compacted.load_manifest(store)
    new = dict(seal_all=True, source=source, dest=dest, groups=5, slice_duration="10s", overwrite=True)
    with pytest.raises(Exception, match="injected failure"):
        compact_dying_after(CompactConfig(**new), spark, files=1)
    assert compacted.versions(store) == [1] and compacted.load_manifest(store) == before
    assert verify(open_source(source), store).ok  # the failed run's files are invisible
    with reader.replay(dest, threads=2) as events:
        assert sorted(keys_of(events)) == source_keys(source)
    assert compact(CompactConfig(**new), spark).version == 2  # invariant 5: a re-run succeeds
    assert compacted.load_manifest(store).groups == 5 and verify(open_source(source), store).ok


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
def test_a_version_vacuumed_under_a_replay_fails_it_naming_the_file_and_the_latest(source, request, backend):
    """An overwrite commits and a vacuum with --retain 0s deletes the version a running replay
    reads: the replay fails naming the file it could not read and the version now latest,
    having delivered each record once and nothing of the new version. (In process: the
    stores are what is tested.)"""
    url = request.getfixturevalue(f"{backend}_url")
    compact(CompactConfig(seal_all=True, source=source, dest=url, groups=4, slice_duration="5s"))
    got = []
    with pytest.raises(reader.ReplayError) as err:
        with reader.replay(url, threads=2, batch_size=50, queue_batches=1, read_ahead_bytes=1 << 12) as events:
            it = iter(events)
            got += keys_of([next(it) for _ in range(3)])
            compact(
                CompactConfig(seal_all=True, source=source, dest=url, groups=3, slice_duration="5s", overwrite=True)
            )
            store = open_storage(url)
            vacuum_files(store, vacuum_plan(store, retain_ms=0))
            for ev in it:
                got += keys_of([ev])
    message = str(err.value)
    assert "gone; the version this read opened was deleted" in message and "version 2 is the latest" in message
    assert f"{url}/{compacted.GROUPS}/" in message and compacted.load_manifest(store).run not in message
    assert len(got) == len(set(got)) and set(got) < set(source_keys(source))


@pytest.mark.parametrize("backend", ["s3", "gcs", "azure"])
def test_segment_files_replaced_under_a_replay_fail_it_naming_one_never_decoding_it(source, request, backend):
    """Every segment file of the version a running replay reads is replaced in place (other
    bytes under the same name, as a tool that rewrites objects would leave them): the replay
    fails naming a replaced file, having delivered only records of the files it opened, each
    once; nothing of the replaced bytes is decoded."""
    url = request.getfixturevalue(f"{backend}_url")
    compact(CompactConfig(seal_all=True, source=source, dest=url, groups=4, slice_duration="5s"))
    store = open_storage(url)
    segments = [o.key for o in store.list(compacted.GROUPS + "/")]
    got = []
    with pytest.raises(reader.ReplayError) as err:
        with reader.replay(url, threads=2, batch_size=50, queue_batches=1, read_ahead_bytes=1 << 12) as events:
            it = iter(events)
            got += keys_of([next(it) for _ in range(3)])
            for key in segments:
                data = store.read(key)
                store.write(key, data[:1000] + bytes(b ^ 0x5A for b in data[1000:]))  # same length, other bytes
            for ev in it:
                got += keys_of([ev])
    message = str(err.value)
    assert "CRC-32C differs from the index (file corrupted or replaced)" in message, message
    assert any(store.url_for(key) in message for key in segments), message
    assert len(got) == len(set(got)) and set(got) < set(source_keys(source))


def test_a_spark_task_whose_version_was_vacuumed_fails_naming_the_file(source, tmp_path):
    """The Spark source's task side, planned on version 1, reading after an overwrite and a
    vacuum with --retain 0s: the same VersionGone as the replay, naming the file."""
    import reader.spark.enumerator
    import reader.spark.options
    import reader.spark.split_reader
    from reader.errors import VersionGone

    url = str(tmp_path / "c")
    compact(CompactConfig(seal_all=True, source=source, dest=url, groups=4, slice_duration="5s"))
    opts = reader.spark.options.Options.parse({"path": url, "numPartitions": "1"})
    planner = reader.spark.enumerator.ArchivePlanner(opts)
    (partition,) = planner.plan(0, planner.manifest.slices)
    compact(CompactConfig(seal_all=True, source=source, dest=url, groups=3, slice_duration="5s", overwrite=True))
    store = open_storage(url)
    vacuum_files(store, vacuum_plan(store, retain_ms=0))
    with pytest.raises(VersionGone, match="version 2 is the latest") as err:
        list(reader.spark.split_reader.read_archive(opts, partition))
    assert store.url_for(partition.pieces[0].file) in str(err.value)


@pytest.mark.parametrize("alike", [True, False], ids=["recompacted-alike", "recompacted-otherwise"])
def test_a_spark_query_whose_version_is_vacuumed_stops_and_resumes_each_record_once(spark, source, tmp_path, alike):
    """An AvailableNow query reads version 1 a few slices a micro-batch. After its first, an
    overwrite commits and a vacuum with --retain 0s deletes version 1's files: the query stops
    with VersionGone naming the object and the latest version, having delivered only records
    of version 1, each once. Restarted from its checkpoint: recompacted alike (same input and
    configuration: the same archive id), it goes on in version 2's files from the slice it
    reached, every record once; recompacted otherwise, it stops with ArchiveChanged naming both
    ids, and a new checkpoint reads version 2 whole."""
    from pyspark.errors import StreamingQueryException

    import reader.spark

    reader.spark.register(spark)
    url = str(tmp_path / "c")
    cfg = dict(seal_all=True, source=source, dest=url, groups=4, slice_duration="5s")
    compact(CompactConfig(**cfg))
    first = compacted.load_manifest(open_storage(url))
    got: list[tuple[int, int]] = []

    def keep(batch, i: int) -> None:
        rows = batch.select("partition", "offset").toArrow()
        got.extend(zip(rows.column(0).to_pylist(), rows.column(1).to_pylist()))
        if compacted.load_manifest(open_storage(url)).version == 1:
            compact(CompactConfig(**{**cfg, "overwrite": True, "groups": 4 if alike else 3}))
            store = open_storage(url)
            assert vacuum_files(store, vacuum_plan(store, retain_ms=0)) > 0  # version 1's files are gone

    def run(checkpoint: str) -> None:
        df = spark.readStream.format("keyfill").option("maxSlicesPerTrigger", "6").load(url)
        writer = df.writeStream.foreachBatch(keep).option("checkpointLocation", str(tmp_path / checkpoint))
        writer.trigger(availableNow=True).start().awaitTermination()

    everything = source_keys(source)
    with pytest.raises(StreamingQueryException) as err:
        run("ck")
    assert "gone; the version this read opened was deleted" in str(err.value)
    assert f"{url}/index/" in str(err.value) and "version 2 is the latest" in str(err.value)
    assert got and len(got) == len(set(got)) and set(got) < set(everything)
    second = compacted.load_manifest(open_storage(url))
    if alike:
        run("ck")
        assert second.archive == first.archive
        assert sorted(got) == everything  # every record, once, across the two versions
        return
    with pytest.raises(StreamingQueryException) as err:
        run("ck")
    assert f"holds offsets of archive {first.archive}, but this archive is {second.archive}" in str(err.value)
    got.clear()
    run("ck-new")
    assert sorted(got) == everything


def test_of_two_compactions_racing_for_a_version_exactly_one_commits(spark, source, tmp_path, monkeypatch):
    dest = str(tmp_path / "c")
    compact(CompactConfig(seal_all=True, source=source, dest=dest, groups=3, slice_duration="30s"), spark)
    store = open_storage(dest)
    rewrite = job.rewrite_groups
    rival = CompactConfig(seal_all=True, source=source, dest=dest, groups=4, slice_duration="1m", overwrite=True)

    def rewrite_then_lose_the_race(*args, **kwargs):
        written = rewrite(*args, **kwargs)
        monkeypatch.setattr(job, "rewrite_groups", rewrite)
        # The rival would stop at once, seeing this run's live lease (lease.check_alone); here it
        # does not (as if the two had started on stores whose listings lagged): the commit decides.
        monkeypatch.setattr(lease, "check_alone", lambda *args: None)
        assert compact(rival, spark).version == 2  # the rival commits while this run is writing
        return written

    monkeypatch.setattr(job, "rewrite_groups", rewrite_then_lose_the_race)
    with pytest.raises(compacted.CommitConflict, match="another compaction committed version 2") as err:
        compact(
            CompactConfig(seal_all=True, source=source, dest=dest, groups=6, slice_duration="10s", overwrite=True),
            spark,
        )
    assert store.url_for(compacted.version_key(2)) in str(err.value) and "--overwrite" in str(err.value)
    assert compacted.versions(store) == [1, 2]
    winner = compacted.load_manifest(store)
    assert winner.groups == 4 and winner.parent == 1  # the rival's version, untouched by the loser
    assert verify(open_source(source), store).ok


def test_versions_command_lists_every_commit(spark, source, tmp_path, capsys):
    dest = str(tmp_path / "c")
    for groups in (2, 3):
        compact(
            CompactConfig(seal_all=True, source=source, dest=dest, groups=groups, slice_duration="1m", overwrite=True),
            spark,
        )
    capsys.readouterr()
    assert main(["versions", dest, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["version"], r["parent"], r["kind"], r["records"]) for r in rows] == [
        (1, None, "compact", 6_000),
        (2, 1, "compact", 6_000),
    ]
    assert rows[0]["archive"] != rows[1]["archive"] and rows[0]["created_ms"] <= rows[1]["created_ms"]
    assert main(["versions", dest]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[2].split()[:3] == ["2", out[2].split()[1], "compact"]
    assert main(["versions", str(tmp_path / "nothing")]) == 2
    assert "no committed version" in capsys.readouterr().err


def test_vacuum_keeps_what_retained_versions_name_and_deletes_the_rest(spark, source, tmp_path, capsys):
    dest = tmp_path / "c"
    url = str(dest)
    compact(CompactConfig(seal_all=True, source=source, dest=url, groups=3, slice_duration="30s"), spark)
    with pytest.raises(Exception, match="injected failure"):  # a failed run leaves files no version names
        compact_dying_after(CompactConfig(seal_all=True, source=source, dest=url, groups=5, overwrite=True), spark)
    compact(CompactConfig(seal_all=True, source=source, dest=url, groups=2, slice_duration="1m", overwrite=True), spark)
    (dest / "notes.txt").write_text("the team's\n")
    store = open_storage(url)
    v1, v2 = (compacted.load_manifest(store, v) for v in (1, 2))
    before = {o.key for o in store.list()}
    failed = {
        k
        for k in before
        if compacted.is_archive_key(k) and not k.startswith(compacted.VERSIONS) and v1.run not in k and v2.run not in k
    }
    assert failed  # the failed run's segment files and assignment

    failed_run = {compacted.run_of(k)[0] for k in failed}
    assert len(failed_run) == 1 and compacted.lease_key(*failed_run) in before  # marked failed, not deleted
    failed.add(compacted.lease_key(*failed_run))
    # Within the window, version 1 was the latest a moment ago: a reader may have it open. The
    # failed run's lease says it ended: its files go at once, its lease last.
    plan = vacuum_plan(store, retain_ms=3_600_000)
    assert (plan.retained, plan.expired, set(plan.files)) == ([1, 2], [], failed)
    assert plan.files[-1] == compacted.lease_key(*failed_run) and (plan.kept_live, plan.kept_unknown) == (0, 0)
    # An hour on, version 1 has expired: its files and the failed run's go, nothing else.
    plan = vacuum_plan(store, retain_ms=3_600_000, now_ms=v2.created_ms + 3_600_001)
    assert (plan.retained, plan.expired) == ([2], [1])
    assert plan.files[0] == compacted.version_key(1)  # invisible before its files go
    expired_run = {compacted.version_key(1), compacted.lease_key(v1.run)}  # its lease, written by vacuum, goes last
    assert set(plan.files) == {k for k in before if v1.run in k} | expired_run | failed
    assert [lease.run for lease in plan.mark_expired] == [v1.run]  # first: a stopped vacuum resumes
    assert main(["vacuum", url, "--retain", "0s"]) == 0  # a dry run lists ...
    out = capsys.readouterr().out
    assert "would delete" in out and store.url_for(compacted.version_key(1)) in out
    assert {o.key for o in store.list()} == before  # ... and deletes nothing
    assert main(["vacuum", url, "--retain", "0s", "--json"]) == 0  # as a script reads it
    doc = json.loads(capsys.readouterr().out)
    assert (doc["deleted"], doc["retained"], doc["expired"]) == (False, [2], [1])
    assert doc["files"] == [store.url_for(k) for k in plan.files] and doc["bytes"] == plan.bytes
    assert {o.key for o in store.list()} == before
    assert main(["vacuum", url, "--retain", "0s", "--delete"]) == 0
    assert f"deleting {len(plan.files)} files" in capsys.readouterr().out
    after = {o.key for o in store.list()}
    assert after == before - set(plan.files) and "notes.txt" in after
    assert compacted.versions(store) == [2] and verify(open_source(source), store).ok
    with reader.replay(url, threads=2) as events:
        assert sorted(keys_of(events)) == source_keys(source)
    assert main(["vacuum", url, "--retain", "0s", "--delete"]) == 0  # nothing left to do
    assert capsys.readouterr().out.startswith("deleting 0 files")
