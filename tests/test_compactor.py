"""The compaction job on a real local[2] Spark, audited by `verify`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactor import rewrite
from compactor.errors import SlicingError
from compactor.job import CompactConfig, compact
from compactor.sources import open_source
from compactor.sources.envelope import write_chunk
from compactor.verify import verify
from compactor.verify.spark import verify_spark
from keyfill.synth.generate import GeneratorConfig, generate
from keygroups import compacted
from keygroups.storage import StorageError, open_storage
from tests.fault_injection import compact_dying_after
from tests.records import (
    archive_assignment,
    archive_metas,
    canonical_files,
    check_sealed,
    envelope_records,
    read_pieces,
    sealed_slices,
)


def files(url: str) -> dict[str, bytes]:
    store = open_storage(url)
    return {o.key: store.read(o.key) for o in store.list()}


def replay_in_order(url: str) -> list[dict]:
    """Records slice by slice, group by group, piece order: what a one-thread reader sees."""
    out = []
    for meta, p, batch in read_pieces(open_storage(url)):
        for r in batch.to_pylist():
            r["slice"], r["group"] = meta.slice, p.group
            out.append(r)
    return out


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    src = str(tmp_path_factory.mktemp("src"))
    generate(
        GeneratorConfig(
            out=src,
            records=60_000,
            keys=400,
            partitions=4,
            chunk_records=7_000,
            skew=1.2,
            jitter_ms=4_000,
            null_keys=0.03,
            headers=True,
            rate=200.0,
            seed=5,
        ),
        progress=False,
    )
    return src


def test_compact_then_verify_passes_on_both_backends(spark, skewed, storage_url):
    cfg = CompactConfig(source=skewed, dest=storage_url, groups=6, slice_duration="1m", seal_all=True)
    result = compact(cfg, spark)
    assert result.records == 60_000 and result.groups == 6
    report = verify(open_source(skewed), open_storage(storage_url))
    assert report.ok, report.violations
    assert report.records == 60_000
    on_spark = verify_spark(open_source(skewed), open_storage(storage_url), spark)
    assert on_spark.ok, on_spark.violations
    assert on_spark.records == 60_000 and on_spark.files == report.files
    store = open_storage(storage_url)
    manifest = compacted.load_manifest(store)
    assert manifest.totals.records == 60_000
    # one segment file per group here (all far below the target), pieces by group in each slice
    keys = [o.key for o in store.list(compacted.GROUPS + "/")]
    assert len(keys) == result.files == len({k.split("/")[1] for k in keys})
    assert all(compacted.is_archive_key(o.key) for o in store.list())
    for meta in archive_metas(store):
        assert [p.group for p in meta.pieces] == sorted({p.group for p in meta.pieces})
    # hand-off: the next offset after the archive, for every partition
    src = open_source(skewed).list_chunks()
    for p in range(4):
        assert manifest.handoff[p] == max(c.last_offset for c in src if c.partition == p) + 1


def test_per_key_order_and_interleaving_inside_files(spark, skewed, tmp_path):
    dest = str(tmp_path / "c")
    compact(CompactConfig(source=skewed, dest=dest, groups=3, slice_duration="2m"), spark)
    rows = replay_in_order(dest)
    last: dict = {}
    for r in rows:  # invariant 1 for a sequential replay of the whole archive
        k = (r["key"], r["partition"] if r["key"] is None else None)
        assert r["offset"] > last.get(k, -1)
        last[k] = r["offset"]
        # and every partition's own order is kept inside a file
    for s, g in {(r["slice"], r["group"]) for r in rows}:
        in_file = [r for r in rows if r["slice"] == s and r["group"] == g]
        for p in {r["partition"] for r in in_file}:
            offs = [r["offset"] for r in in_file if r["partition"] == p]
            assert offs == sorted(offs)


def test_balance_beats_hashing(spark, skewed, tmp_path):
    dest = str(tmp_path / "c")
    r = compact(CompactConfig(source=skewed, dest=dest, groups=8, slice_duration="10m"), spark)
    a = archive_assignment(open_storage(dest))
    weights = a.column("bytes").to_numpy()
    lower_bound = max(weights.sum() / 8, weights.max())
    assert r.max_group_bytes <= lower_bound * 1.01


def test_same_input_same_bytes(spark, skewed, tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    compact(CompactConfig(source=skewed, dest=a, groups=5, slice_duration="1m"), spark)
    compact(CompactConfig(source=skewed, dest=b, groups=5, slice_duration="1m"), spark)
    assert canonical_files(a) == canonical_files(b)  # invariant 6: assignment, index, every segment file


def test_failure_midway_leaves_no_archive_and_rerun_succeeds(spark, skewed, tmp_path):
    dest = str(tmp_path / "c")
    cfg = dict(source=skewed, dest=dest, groups=6, slice_duration="1m")
    with pytest.raises(Exception, match="injected failure"):
        compact_dying_after(CompactConfig(**cfg), spark, files=1)
    store = open_storage(dest)
    assert any(o.key.endswith(".avro") for o in store.list())  # it did write part of the data ...
    with pytest.raises(compacted.FormatError, match="no committed version"):
        compacted.load_manifest(store)  # ... but no archive is visible
    assert not verify(open_source(skewed), store).ok
    compact(CompactConfig(**cfg), spark)  # invariant 5: a re-run succeeds
    assert verify(open_source(skewed), store).ok


def test_existing_archive_needs_overwrite(spark, skewed, tmp_path):
    dest = str(tmp_path / "c")
    compact(CompactConfig(source=skewed, dest=dest, groups=2, slice_duration="10m"), spark)
    with pytest.raises(StorageError, match="--overwrite"):
        compact(CompactConfig(source=skewed, dest=dest, groups=3, slice_duration="10m"), spark)
    compact(CompactConfig(source=skewed, dest=dest, groups=3, slice_duration="10m", overwrite=True), spark)
    assert compacted.load_manifest(open_storage(dest)).groups == 3
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(StorageError, match="notes.txt"):
        compact(CompactConfig(source=skewed, dest=str(foreign), groups=2), spark)


records = envelope_records


def test_empty_slices_are_recorded(spark, tmp_path):
    src = open_storage(str(tmp_path / "src"))
    minute = 60_000
    # partition 0 goes quiet for 5 minutes; partition 1 stops early (an idle partition)
    write_chunk(src, records(0, range(0, 5), [0, 10, 20, 5, 30], [b"a", b"b", b"a", None, b"c"]), "t")
    write_chunk(src, records(0, range(5, 8), [6 * minute, 6 * minute + 1, 6 * minute - 9], [b"a", b"b", b"a"]), "t")
    write_chunk(src, records(1, range(0, 3), [1, 2, 3], [b"x", b"y", None]), "t")
    dest = str(tmp_path / "c")
    r = compact(CompactConfig(source=src.url, dest=dest, groups=2, slice_duration="1m", seal_all=True), spark)
    assert r.slices == 7 and r.empty_slices == 5
    store = open_storage(dest)
    metas = archive_metas(store)
    empty = metas[3]
    assert empty.pieces == [] and empty.partitions == [] and empty.end_ms - empty.start_ms == minute
    assert verify(open_source(src.url), store).ok
    last = metas[6]
    assert [(p.partition, p.first_offset, p.last_offset) for p in last.partitions] == [(0, 5, 7)]


def test_a_lagging_partition_holds_back_the_seal_and_the_handoff_points_at_what_it_left_out(spark, tmp_path):
    src = open_storage(str(tmp_path / "src"))
    s = 1000
    write_chunk(
        src, records(0, range(6), [0, 10, 20, 70 * s, 130 * s, 190 * s], [b"a", b"b", b"a", b"a", b"c", b"b"]), "t"
    )
    write_chunk(src, records(1, range(3), [1, 2, 65 * s], [b"x", b"y", b"x"]), "t")  # lags: its data ends at 65 s
    dest = str(tmp_path / "c")
    r = compact(CompactConfig(source=src.url, dest=dest, groups=2, slice_duration="1m"), spark)
    # partition 1's running maximum is in slice 1: it may still add records there, so only slice 0 is sealed
    assert (r.slices, r.records, r.withheld) == (1, 5, 4)
    store = open_storage(dest)
    manifest = compacted.load_manifest(store)
    assert manifest.handoff == {0: 3, 1: 2} and manifest.running_max == {0: 20, 1: 2}
    assert sorted((row["partition"], row["offset"]) for row in replay_in_order(dest)) == [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
    ]
    assert verify(open_source(src.url), store).ok
    assert verify_spark(open_source(src.url), store, spark).ok
    # the hand-off must be where the seal leaves off: verify notices one that is not
    key = compacted.version_key(manifest.version)
    doc = json.loads(store.read(key))
    doc["handoff"]["1"] = 3
    store.write(key, compacted.dumps(doc))
    report = verify(open_source(src.url), store)
    assert not report.ok and any("partition 1: manifest hand-off offset 3" in v for v in report.violations["handoff"])
    # --seal-all publishes everything (a topic that will not grow)
    r = compact(
        CompactConfig(source=src.url, dest=dest, groups=2, slice_duration="1m", seal_all=True, overwrite=True), spark
    )
    assert (r.slices, r.records, r.withheld) == (4, 9, 0)
    assert compacted.load_manifest(store).handoff == {0: 6, 1: 3} and verify(open_source(src.url), store).ok


def test_gaps_and_overlaps_are_refused_naming_the_chunks(spark, tmp_path):
    src = open_storage(str(tmp_path / "src"))
    write_chunk(src, records(0, range(0, 5), range(5), [b"a"] * 5), "t")
    write_chunk(src, records(0, range(8, 10), range(8, 10), [b"a"] * 2), "t")
    with pytest.raises(SlicingError, match="5..7 missing"):
        compact(CompactConfig(source=src.url, dest=str(tmp_path / "c"), groups=2), spark)
    assert not compacted.versions(open_storage(str(tmp_path / "c")))
    r = compact(
        CompactConfig(source=src.url, dest=str(tmp_path / "c"), groups=2, allow_gaps=True, seal_all=True), spark
    )
    assert r.records == 7
    assert "5..7 missing" in compacted.load_manifest(open_storage(str(tmp_path / "c"))).gaps[0]


def test_segment_files_are_cut_near_the_target(spark, skewed, tmp_path):
    dest = str(tmp_path / "c")
    target = 96 << 10
    r = compact(
        CompactConfig(source=skewed, dest=dest, groups=3, slice_duration="10s", target_file_bytes=target), spark
    )
    store = open_storage(dest)
    manifest = compacted.load_manifest(store)
    sizes: dict[int, dict[str, int]] = {}
    for meta in archive_metas(store):
        for p in meta.pieces:
            sizes.setdefault(p.group, {})[p.file] = p.file_bytes
            assert p.file == compacted.segment_key(p.group, int(p.file.split("/")[2][:10]), manifest.run)
    assert sum(len(f) for f in sizes.values()) == r.files == manifest.totals.files
    for files in sizes.values():
        ordered = [files[k] for k in sorted(files)]
        assert len(ordered) <= -(-sum(ordered) // target)  # no group left with several small files
        assert all(size >= target for size in ordered[:-1])
        assert len(ordered) > 1  # the target did cut
    assert r.pieces == manifest.totals.pieces > r.files
    assert verify(open_source(skewed), store).ok


def test_groups_default_from_the_data(spark, skewed, tmp_path):
    from compactor.job import MIN_GROUPS

    r = compact(CompactConfig(source=skewed, dest=str(tmp_path / "c")), spark)
    assert r.groups == MIN_GROUPS  # a small archive: the floor
    assert compacted.load_manifest(open_storage(str(tmp_path / "c"))).config.slice_duration == "1m"


def test_default_groups_rule():
    from compactor.job import default_groups

    target = 64 << 20
    assert default_groups(10 << 30, 10_000, target) == 64  # 10 GiB / 256 MiB = 40 -> 64
    assert default_groups(1 << 40, 10_000, target) == 1024  # the ceiling
    assert default_groups(1 << 20, 10_000, target) == 16  # the floor
    assert default_groups(1 << 40, 5, target) == 5  # never more groups than keys


@st.composite
def small_archive(draw):
    parts = draw(st.integers(1, 3))
    keys = [None, b"hot"] + [b"k%d" % i for i in range(draw(st.integers(1, 8)))]
    chunks = []
    for p in range(parts):
        n = draw(st.integers(1, 60))
        ts = np.cumsum(draw(st.lists(st.integers(0, 4000), min_size=n, max_size=n)))
        ts = ts - np.array(draw(st.lists(st.integers(0, 9000), min_size=n, max_size=n)))
        ks = draw(st.lists(st.sampled_from(keys), min_size=n, max_size=n))
        cuts = sorted(set(draw(st.lists(st.integers(1, max(1, n - 1)), max_size=3))) - {n})
        for a, b in zip([0, *cuts], [*cuts, n]):
            chunks.append((p, list(range(a, b)), ts[a:b].tolist(), ks[a:b]))
    sizes = draw(st.sampled_from([{}, {"target_file_bytes": 4096, "block_bytes": 1024}]))
    sizes["exact_keys"] = draw(st.sampled_from([None, 0, 3]))  # 0, 3: heavy keys exact, the rest in hash buckets
    return chunks, draw(st.integers(1, 5)), draw(st.sampled_from(["2s", "10s", "1m"])), sizes


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(case=small_archive())
def test_small_archives_keep_invariants_1_5_6(spark, tmp_path_factory, case):
    """Also: the compaction run in this process (`spark=None`) writes the same bytes as Spark."""
    chunks, groups, duration, sizes = case
    root = tmp_path_factory.mktemp("h")
    src = open_storage(str(root / "src"))
    for p, offs, ts, ks in chunks:
        write_chunk(src, records(p, offs, ts, ks), "t", codec="null")
    a, b = str(root / "a"), str(root / "b")
    cfg = dict(source=src.url, groups=groups, slice_duration=duration, **sizes)
    # what the source says the archive must hold: its sealed slices, each record in its running
    # maximum's slice (tests/records.py); the manifest's hand-off and the index must agree
    positions = [(p, o, t) for p, offs, ts, _ in chunks for o, t in zip(offs, ts)]
    want = sealed_slices(positions, CompactConfig(**cfg, dest=a).slice_duration_ms)
    try:
        compact(CompactConfig(**cfg, dest=a), spark)
        assert want is not None, "a version committed, yet the source seals nothing"
    except SlicingError as e:  # so small an archive may have nothing sealed yet: publish it whole
        assert "no slice is sealed yet" in str(e) and want is None, e
        cfg["seal_all"] = True
        compact(CompactConfig(**cfg, dest=a), spark)
        want = sealed_slices(positions, CompactConfig(**cfg, dest=a).slice_duration_ms, seal_all=True)
    report = verify(open_source(src.url), open_storage(a))
    assert report.ok, report.violations
    rows = replay_in_order(a)
    check_sealed(open_storage(a), want)
    assert sorted((r["partition"], r["offset"]) for r in rows) == sorted(want.placed)
    assert all(want.placed[(r["partition"], r["offset"])] == r["slice"] for r in rows)
    last: dict = {}
    for r in rows:  # offsets order records within a partition only: a key may span partitions here
        k = (r["key"], r["partition"])
        assert r["offset"] > last.get(k, -1)
        last[k] = r["offset"]
    compact(CompactConfig(**cfg, dest=b), spark=None)
    assert canonical_files(a) == canonical_files(b)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=small_archive(), parcel_bytes=st.integers(1, 2000))
def test_parcels_of_any_size_write_the_same_bytes(tmp_path_factory, case, parcel_bytes):
    """The rewrite ships a group's records as sorted parcels and its write task merges them
    slice by slice (`compactor/rewrite.py`). Cut into parcels of a few records, flushed chunk
    by chunk, so that parcels of several partitions overlap in slices, it writes what one
    parcel per group writes."""
    chunks, groups, duration, sizes = case
    root = tmp_path_factory.mktemp("r")
    src = open_storage(str(root / "src"))
    for p, offs, ts, ks in chunks:
        write_chunk(src, records(p, offs, ts, ks), "t", codec="null")
    cfg = dict(source=src.url, groups=groups, slice_duration=duration, seal_all=True, **sizes)
    compact(CompactConfig(**cfg, dest=str(root / "one")))
    parcels: list[int] = []
    shipped = rewrite._parcel_rows
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rewrite, "PARCEL_BYTES", parcel_bytes)
        mp.setattr(rewrite, "FLUSH_BYTES", (1, 1))  # a flush per chunk
        mp.setattr(rewrite, "_parcel_rows", lambda rows, messages: parcels.append(len(rows)) or shipped(rows, messages))
        compact(CompactConfig(**cfg, dest=str(root / "many")))
    assert sum(parcels) >= len(chunks)
    assert canonical_files(str(root / "one")) == canonical_files(str(root / "many"))


def test_kafka_connect_layout_compacts_and_verifies(spark, skewed, tmp_path):
    from keyfill.synth.kafka_connect import write_connect_archive

    connect = str(tmp_path / "connect")
    write_connect_archive(open_source(skewed), connect, records_per_file=5_000)
    dest = str(tmp_path / "c")
    cfg = CompactConfig(
        source=connect,
        dest=dest,
        groups=4,
        slice_duration="1m",
        source_format="kafka-connect",
        source_options={"timestamp_field": "ts"},
        seal_all=True,
    )
    r = compact(cfg, spark)
    assert r.records == 60_000
    source = open_source(connect, format="kafka-connect", options={"timestamp_field": "ts"})
    report = verify(source, open_storage(dest))
    assert report.ok, report.violations
    # same keys, same groups as compacting the envelope archive it came from
    env_dest = str(tmp_path / "e")
    compact(CompactConfig(source=skewed, dest=env_dest, groups=4, slice_duration="1m", seal_all=True), spark)
    a = archive_assignment(open_storage(dest)).select(["key", "null_key_partition", "records"])
    b = archive_assignment(open_storage(env_dest)).select(["key", "null_key_partition", "records"])
    assert a.sort_by("key").equals(b.sort_by("key"))
