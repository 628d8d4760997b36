"""The barrier-synchronised replay: docs/design.md, invariants 1-4 for any thread count, and
exactly-once across any number of checkpoint/restore points."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reader
import reader.fetched_span
import reader.replay_plan
from compactor.errors import SlicingError
from compactor.job import CompactConfig, compact
from compactor.sources.envelope import build_index, read_chunk, write_chunk
from keyfill.synth.generate import GeneratorConfig, generate
from keygroups import compacted, envelope
from keygroups.piece_index import row_group_of
from keygroups.storage import open_storage
from tests.records import archive_metas, below_handoff, copy_archive, rewrite_index
from tests.waits import WAIT_S, wait_until


def hypothesis_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def source_table(url: str) -> pa.Table:
    store = open_storage(url)
    return pa.Table.from_batches([read_chunk(store, c) for c in build_index(store).all_chunks()])


def running_max_before(src: pa.Table) -> dict[tuple[int, int], tuple[int, int]]:
    """(partition, offset) -> (timestamp, running max of earlier records in the partition)."""
    out = {}
    parts = src.column("partition").to_numpy()
    offs = src.column("offset").to_numpy()
    ts = src.column("timestamp").cast(pa.int64()).to_numpy()
    for p in np.unique(parts):
        m = parts == p
        o, t = offs[m], ts[m]
        order = np.argsort(o)
        o, t = o[order], t[order]
        before = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(t)[:-1]])
        out.update({(int(p), int(a)): (int(b), int(c)) for a, b, c in zip(o, t, before)})
    return out


class Archives(dict):
    def __repr__(self) -> str:  # keeps hypothesis' failure reports readable
        return f"<archives {sorted(self)}>"


@pytest.fixture(scope="module")
def archives(spark, tmp_path_factory):
    """A skewed archive (null keys, headers, jitter, several slices), a hot-key one, and a
    "short" one: 1-second slices (hundreds, many empty for most groups) with a hot key, in
    segment files cut at 16 KiB, so runs of pieces cross file boundaries."""
    root = tmp_path_factory.mktemp("reader")
    out = Archives()
    for name, extra, groups, duration, target in [
        ("skewed", dict(skew=1.2, null_keys=0.05), 7, "20s", None),
        ("hot", dict(hot_key_share=0.9, null_keys=0.0), 16, "20s", None),
        ("short", dict(hot_key_share=0.5, null_keys=0.02, rate=25.0, records=6_000), 16, "1s", 8 << 10),
    ]:
        src = str(root / f"{name}-src")
        generate(
            GeneratorConfig(
                out=src,
                keys=300,
                partitions=3,
                chunk_records=3_000,
                jitter_ms=5_000,
                headers=True,
                **{"records": 20_000, "rate": 100.0, "seed": 9, **extra},
            ),
            progress=False,
        )
        dest = str(root / f"{name}-c")
        sizes = {"target_file_bytes": target} if target else {}
        compact(CompactConfig(source=src, dest=dest, groups=groups, slice_duration=duration, **sizes), spark)
        table = below_handoff(source_table(src), dest)
        out[name] = (dest, table, running_max_before(table))
    # an archive with empty slices and an idle partition
    src = open_storage(str(root / "gappy-src"))
    recs = lambda p, offs, ts, keys: envelope.batch_from_records(  # noqa: E731
        [
            {"partition": p, "offset": o, "timestamp": t, "key": k, "value": b"x", "headers": []}
            for o, t, k in zip(offs, ts, keys)
        ]
    )
    write_chunk(src, recs(0, range(4), [0, 5_000, 2_000, 400_000], [b"a", b"b", b"a", b"a"]), "t")
    write_chunk(src, recs(1, range(3), [1, 2, 300_000 - 1], [b"c", None, b"c"]), "t")
    dest = str(root / "gappy-c")
    compact(CompactConfig(source=src.url, dest=dest, groups=3, slice_duration="1m", seal_all=True), spark)
    table = source_table(src.url)
    out["gappy"] = (dest, table, running_max_before(table))
    return out


def run(events, limit: int | None = None) -> tuple[list, dict | None]:
    """Events up to `limit` (all when None) and the checkpoint taken right after them."""
    got = []
    for ev in events:
        got.append(ev)
        if limit is not None and len(got) >= limit:
            return got, events.checkpoint()
    return got, None


def check_invariants(events: list, table: pa.Table, before: dict, bound: int) -> None:
    rows = []
    watermark = None
    marks = []
    for ev in events:
        if isinstance(ev, reader.Watermark):
            assert watermark is None or ev.timestamp_ms >= watermark  # 4: never backwards
            watermark = ev.timestamp_ms
            marks.append(ev.timestamp_ms)
            continue
        assert ev.batch.schema == reader.RECORD_SCHEMA
        assert set(ev.batch.column("key_group").to_pylist()) == {ev.group}
        for p, o, t in zip(
            ev.batch.column("partition").to_pylist(),
            ev.batch.column("offset").to_pylist(),
            ev.batch.column("timestamp").cast(pa.int64()).to_pylist(),
        ):
            if watermark is not None and t < watermark:  # 3: late in the replay => late originally
                ts, runmax = before[(p, o)]
                assert ts < runmax - bound, (p, o, t, watermark)
        rows.extend(
            zip(
                ev.batch.column("partition").to_pylist(),
                ev.batch.column("offset").to_pylist(),
                ev.batch.column("key").to_pylist(),
            )
        )
    # 2: exactly the source's records, each once
    assert sorted((p, o) for p, o, _ in rows) == sorted(
        zip(table.column("partition").to_pylist(), table.column("offset").to_pylist())
    )
    # 1: per key (per partition) in offset order
    last: dict = {}
    for p, o, k in rows:
        assert o > last.get((k, p), -1)
        last[(k, p)] = o
    assert marks == sorted(marks)


def test_the_short_archive_is_what_the_properties_need(archives):
    """Many short slices, empty pieces, and groups spread over several segment files."""
    store = open_storage(archives["short"][0])
    metas = archive_metas(store)
    files: dict[int, set[str]] = {}
    for m in metas:
        for p in m.pieces:
            files.setdefault(p.group, set()).add(p.file)
    assert len(metas) >= 200 and sum(1 for m in metas if len(m.pieces) < 16) >= 100
    assert max(len(f) for f in files.values()) >= 5


@hypothesis_settings(60)
@given(
    name=st.sampled_from(["skewed", "hot", "gappy", "short"]),
    threads=st.integers(1, 16),
    batch_size=st.sampled_from([1, 7, 100, 65_536]),
    bound=st.sampled_from([0, 1_000, 30_000]),
    drift=st.sampled_from([None, 0, 2_000]),
    decode_bytes=st.sampled_from([1, 3_000, reader.fetched_span.DECODE_BYTES]),
)
def test_invariants_hold_for_any_thread_count(archives, name, threads, batch_size, bound, drift, decode_bytes):
    dest, table, before = archives[name]
    with (
        mock.patch.object(reader.fetched_span, "DECODE_BYTES", decode_bytes),  # runs decoded a piece or a few at a time
        reader.replay(
            dest, threads=threads, batch_size=batch_size, watermark_bound_ms=bound, max_drift_ms=drift
        ) as events,
    ):
        got, _ = run(events)
    check_invariants(got, table, before, bound)
    manifest = compacted.load_manifest(open_storage(dest))
    assert [e.timestamp_ms for e in got if isinstance(e, reader.Watermark)] == [
        manifest.bounds(s)[1] - bound for s in range(manifest.slices)
    ]


@hypothesis_settings(40)
@given(name=st.sampled_from(["skewed", "hot", "gappy", "short"]), data=st.data())
def test_checkpoint_and_resume_any_number_of_times_is_exactly_once(archives, name, data):
    dest, table, before = archives[name]
    all_events: list = []
    state = None
    for _ in range(data.draw(st.integers(1, 5))):
        threads = data.draw(st.integers(1, 16))
        limit = data.draw(st.integers(1, 40))
        with (
            mock.patch.object(
                reader.fetched_span, "DECODE_BYTES", data.draw(st.sampled_from([1, reader.fetched_span.DECODE_BYTES]))
            ),
            reader.replay(
                dest, threads=threads, batch_size=data.draw(st.sampled_from([3, 50, 5000])), resume=state
            ) as events,
        ):
            got, checkpoint = run(events, limit)
        all_events += got
        if checkpoint is None:
            state = None
            break
        state = json.loads(json.dumps(checkpoint))  # crosses a process boundary as JSON
    if state is not None:  # finish
        with reader.replay(dest, threads=data.draw(st.integers(1, 16)), resume=state) as events:
            got, _ = run(events)
        all_events += got
    check_invariants(all_events, table, before, 0)


@pytest.mark.parametrize("threads", [3, 16])
def test_threads_row_groups_apart_share_a_tiny_index_cache(archives, threads):
    """Threads never wait for each other, so they may read index row groups far apart: with
    room for one row group they reload what they need instead of failing, and the replay is whole."""
    dest, table, before = archives["short"]
    with mock.patch.object(reader.replay_plan, "CACHED_ROW_GROUPS", 1), reader.replay(dest, threads=threads) as events:
        got, _ = run(events)
    check_invariants(got, table, before, 0)


def test_row_groups_loaded_together_are_the_row_groups_loaded_one_by_one(archives):
    """A preload reads several index row groups at once and cuts them apart: each comes out
    as if read alone (pieces by group, slice spreads)."""
    store = open_storage(archives["short"][0])
    manifest = compacted.load_manifest(store)
    plan = reader.replay_plan.ReplayPlan(store, manifest, 3)
    row_groups = row_group_of(manifest.slices - 1) + 1
    assert row_groups >= 3
    together = plan._build(0, row_groups)
    assert sorted(together) == list(range(row_groups))
    for b in range(row_groups):
        by_group, spreads = plan._build(b, b + 1)[b]
        assert together[b][1] == spreads
        assert together[b][0].keys() == by_group.keys() and by_group
        for g, pieces in by_group.items():
            assert np.array_equal(together[b][0][g].a, pieces.a)


def test_a_damaged_row_group_in_a_preload_fails_only_the_threads_that_need_it(archives, tmp_path):
    """A preload reads several index row groups at once; when one of them is damaged, a thread
    waiting for a sound row group of the same read gets it, and the damaged one fails with its
    own error naming the piece."""
    import shutil

    from keygroups import piece_index

    dest = str(tmp_path / "copy")
    shutil.copytree(archives["short"][0], dest)
    store = open_storage(dest)
    manifest = compacted.load_manifest(store)
    metas = archive_metas(store)
    victim = next(p for m in reversed(metas) for p in m.pieces)  # in the last row group
    rows = [p if p != victim else p._replace(offset=p.file_bytes + 100) for m in metas for p in m.pieces]
    rewrite_index(store, piece_index.slice_table(metas), piece_index.piece_table(rows))
    plan = reader.replay_plan.ReplayPlan(store, compacted.load_manifest(store), 3)
    last = row_group_of(manifest.slices - 1)
    assert row_group_of(victim.slice) == last >= 2
    with plan._lock:
        claimed = plan._claim(range(1, last + 1))  # as a preload does
    asked = threading.Event()

    class Watched(Future):  # the preload's claim on row group 1, telling when a thread waits on it
        def result(self, timeout=None):
            asked.set()
            return super().result(timeout)

    plan._loading[1] = Watched()
    waited: list = []
    waiting = threading.Thread(target=lambda: waited.append(plan._load(1)))
    waiting.start()
    assert asked.wait(WAIT_S), "the thread never waited for the preload's claim on row group 1"
    with pytest.raises(compacted.FormatError, match=f"slice {victim.slice}, group {victim.group}"):
        plan._fill(claimed)
    waiting.join(timeout=WAIT_S)
    assert waited and waited[0][0], "the sound row group was not loaded"
    with pytest.raises(compacted.FormatError, match=f"slice {victim.slice}, group {victim.group}"):
        plan._load(last)


def watch_pacing(pacer) -> list[tuple[int, int, int | None, bool]]:
    """Record, each time a thread is let through `pace`, (thread, event time, progress of the
    slowest other active thread, whether it was the slowest itself)."""
    trace: list = []
    original = pacer.pace

    def pace(t: int, ts: int) -> None:
        original(t, ts)
        with pacer._cond:
            others = [(pacer._progress[u], u) for u in range(pacer.threads) if u != t and pacer._active[u]]
            slowest = not others or (pacer._progress[t], t) < min(others)
            trace.append((t, ts, None if not others else min(others)[0], slowest))

    pacer.pace = pace
    return trace


@pytest.mark.parametrize("drift", [0, 500, 3_000])
def test_drift_bound_holds_back_threads_that_run_ahead(archives, drift):
    dest, _, _ = archives["hot"]
    with reader.replay(dest, threads=6, batch_size=50, max_drift_ms=drift) as events:
        trace = watch_pacing(events.pacer)
        run(events)
    assert len({t for t, *_ in trace}) > 1
    # a thread moves past the slowest other by more than the bound only when it is the slowest
    assert all(was_slowest or ts - slowest_other <= drift for _, ts, slowest_other, was_slowest in trace)
    with reader.replay(dest, threads=6, batch_size=50) as free:
        run(free)
    assert events.max_spread_ms < free.max_spread_ms


class RangeCountingStore:
    """Delegates to a Storage and records which reads were whole and which were ranged."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.whole: list[str] = []
        self.ranged: list[tuple[str, int, int]] = []
        self._lock = threading.Lock()

    def read(self, key: str) -> bytes:
        with self._lock:
            self.whole.append(key)
        return self._inner.read(key)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        with self._lock:
            self.ranged.append((key, start, length))
        return self._inner.read_range(key, start, length)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


@pytest.mark.parametrize("range_bytes,read_ahead", [(0, 256 << 20), (4_000, 256 << 20), (4_000, 0), (50_000, 60_000)])
def test_pieces_arrive_as_coalesced_ranged_gets_with_the_same_events(archives, storage_url, range_bytes, read_ahead):
    """On local disk and on a real S3 server: consecutive pieces of a file are fetched as
    runs of ranged GETs of at most range_bytes (from the read-ahead, or on demand without
    one), every piece byte exactly once, and the replay is the same, record for record."""
    src_root, table, before = archives["hot"]
    store = RangeCountingStore(copy_archive(src_root, storage_url))
    with reader.replay(
        storage_url, threads=3, batch_size=400, range_bytes=range_bytes, read_ahead_bytes=read_ahead, store=store
    ) as events:
        got, _ = run(events)
        gets = events.gets
    check_invariants(got, table, before, 0)
    with reader.replay(src_root, threads=3, batch_size=400) as events:
        reference, _ = run(events)

    def key(evs):
        return sorted(
            (e.group, e.slice, e.batch.column("offset")[0].as_py(), e.batch.num_rows)
            for e in evs
            if isinstance(e, reader.Records)
        )

    assert key(got) == key(reference)
    files = {p.file: p for m in archive_metas(store) for p in m.pieces}
    assert not [k for k in store.whole if k.endswith(".avro")]  # segment files are never read whole
    ranged = [(k, a, n) for k, a, n in store.ranged if k.endswith(".avro")]
    assert len(ranged) == gets
    if range_bytes:
        assert all(n <= range_bytes + 1 for _, _, n in ranged)
    for f, p in files.items():  # every byte after the header exactly once
        covered = sum(max(0, min(a + n, p.file_bytes) - max(a, p.file_header)) for k, a, n in ranged if k == f)
        assert covered == p.file_bytes - p.file_header
    if range_bytes == 0 and read_ahead:  # a budget this large: one GET per file, header included
        assert gets == len(files)
    if not read_ahead:  # no read-ahead: a piece at a time (in GETs of range_bytes), and a header per file
        pieces = [p for m in archive_metas(store) for p in m.pieces]
        assert len(pieces) <= gets <= sum(-(-p.length // range_bytes) for p in pieces) + 2 * len(files)


def test_an_object_longer_or_shorter_than_its_index_is_an_error(archives, tmp_path):
    dest = str(tmp_path / "copy")
    store = copy_archive(archives["hot"][0], dest)
    victim = max((p for m in archive_metas(store) for p in m.pieces), key=lambda p: p.file_bytes)
    original = store.read(victim.file)
    for data, says in ((original + b"\x00" * 10, "longer than"), (original[:-10], "ends at byte")):
        store.write(victim.file, data)
        with pytest.raises(reader.ReplayError, match=says) as err:
            with reader.replay(dest, threads=2, range_bytes=1_000) as events:
                run(events)
        assert victim.file in str(err.value) and f"group {victim.group}" in str(err.value)


def test_negative_range_bytes_is_refused(archives):
    with pytest.raises(ValueError, match="range_bytes"):
        reader.replay(archives["hot"][0], range_bytes=-1)


def test_a_finished_replay_checkpoint_resumes_to_nothing(archives):
    dest, _, _ = archives["gappy"]
    with reader.replay(dest, threads=2) as events:
        run(events)
        state = events.checkpoint()
    with reader.replay(dest, threads=5, resume=state) as events:
        assert run(events)[0] == []


def test_checkpoint_of_another_archive_is_refused(archives):
    with reader.replay(archives["hot"][0], threads=2) as events:
        state = events.checkpoint()
    with pytest.raises(reader.CheckpointError, match="archive"):
        reader.replay(archives["gappy"][0], resume=state)


def test_checkpoint_is_refused_after_a_recompaction_with_other_groups(spark, archives, tmp_path):
    """Same source, same slices, other group count: the slice count alone would accept the
    checkpoint and then skip or repeat records; the fingerprint names both archives."""
    dest = archives["skewed"][0]
    with reader.replay(dest, threads=3, batch_size=300) as events:
        for i, _ in enumerate(events):
            if i == 5:
                state = events.checkpoint()
                break
    assert state["groups"]  # part-way through a slice
    other = str(tmp_path / "recompacted")
    compact(CompactConfig(source=dest[: -len("-c")] + "-src", dest=other, groups=5, slice_duration="20s"), spark)
    new, old = (compacted.load_manifest(open_storage(u)) for u in (other, dest))
    assert new.slices == old.slices and new.groups != old.groups
    with pytest.raises(reader.CheckpointError) as err:
        reader.replay(other, resume=state)
    assert old.archive in str(err.value) and new.archive in str(err.value)
    with reader.replay(dest, threads=2, resume=state) as events:  # the archive it belongs to still takes it
        assert run(events)[0]


def test_a_corrupt_file_fails_the_consumer_naming_file_and_group(archives, tmp_path):
    import shutil

    dest = str(tmp_path / "copy")
    shutil.copytree(archives["skewed"][0], dest)
    store = open_storage(dest)
    victim = archive_metas(store)[1].pieces[0]
    data = bytearray(store.read(victim.file))
    data[victim.offset + victim.length // 2] ^= 0x10
    store.write(victim.file, bytes(data))
    started = time.monotonic()
    with pytest.raises(reader.ReplayError) as err:
        with reader.replay(dest, threads=4) as events:
            run(events)
    where = f"{victim.file} bytes {victim.offset}..{victim.end} (slice 1, group {victim.group})"
    assert where in str(err.value) and "CRC-32C" in str(err.value)
    assert time.monotonic() - started < 30
    assert not [t for t in threading.enumerate() if t.name.startswith("keyfill-replay")]


def test_leaving_early_stops_all_threads(archives):
    dest, _, _ = archives["skewed"]
    with reader.replay(dest, threads=8, batch_size=10, queue_batches=2) as events:
        for i, _ in enumerate(events):
            if i == 3:
                break
    # close() waits a second for its threads; a busy machine may take longer to end them
    wait_until(
        lambda: not [t for t in threading.enumerate() if t.name.startswith("keyfill-replay") and t.is_alive()],
        "the replay's threads stopped",
    )


def test_missing_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(compacted.FormatError, match="no committed version"):
        reader.replay(str(tmp_path))


@st.composite
def random_archive(draw):
    """Small archives of any shape: partitions, keys (hot, null), jitter, idle stretches."""
    keys = [None, b"hot"] + [b"k%d" % i for i in range(draw(st.integers(1, 12)))]
    chunks = []
    for p in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 80))
        steps = np.array(draw(st.lists(st.sampled_from([0, 1, 10, 500, 30_000]), min_size=n, max_size=n)))
        ts = np.cumsum(steps) - np.array(draw(st.lists(st.integers(0, 8_000), min_size=n, max_size=n)))
        weights = [1, draw(st.integers(1, 30))] + [1] * (len(keys) - 2)
        ks = [keys[i] for i in np.random.default_rng(n).choice(len(keys), n, p=np.array(weights) / sum(weights))]
        cuts = sorted(set(draw(st.lists(st.integers(1, max(1, n - 1)), max_size=3))) - {n})
        for a, b in zip([0, *cuts], [*cuts, n]):
            chunks.append((p, list(range(a, b)), ts[a:b].tolist(), ks[a:b]))
    return chunks, draw(st.integers(1, 9)), draw(st.sampled_from(["1s", "10s", "1m"]))


@hypothesis_settings(40)
@given(case=random_archive(), data=st.data())
def test_random_archives_replay_exactly_once_in_order_across_restarts(tmp_path_factory, case, data):
    """Compacted in process: the bytes Spark writes (test_compactor and test_in_process
    compare the two), at 30 ms an archive instead of ~2 s, so many more archives."""
    chunks, groups, duration = case
    root = tmp_path_factory.mktemp("rnd")
    src = open_storage(str(root / "src"))
    for p, offs, ts, ks in chunks:
        write_chunk(
            src,
            envelope.batch_from_records(
                [
                    {"partition": p, "offset": o, "timestamp": t, "key": k, "value": b"%d" % o, "headers": []}
                    for o, t, k in zip(offs, ts, ks)
                ]
            ),
            "t",
            codec="null",
        )
    dest = str(root / "c")
    try:
        compact(CompactConfig(source=src.url, dest=dest, groups=groups, slice_duration=duration))
    except SlicingError:  # nothing sealed yet in so small an archive: publish it whole
        compact(CompactConfig(source=src.url, dest=dest, groups=groups, slice_duration=duration, seal_all=True))
    table = below_handoff(source_table(src.url), dest)
    before = running_max_before(table)
    bound = data.draw(st.sampled_from([0, 2_000]))
    events, state = [], None
    for _ in range(data.draw(st.integers(0, 4))):
        with reader.replay(
            dest,
            threads=data.draw(st.integers(1, 16)),
            batch_size=data.draw(st.integers(1, 20)),
            watermark_bound_ms=bound,
            resume=state,
            max_drift_ms=data.draw(st.sampled_from([None, 1_000])),
        ) as ev:
            got, state = run(ev, data.draw(st.integers(1, 15)))
        events += got
        if state is None:
            break
    else:
        with reader.replay(dest, threads=data.draw(st.integers(1, 16)), watermark_bound_ms=bound, resume=state) as ev:
            events += run(ev)[0]
    check_invariants(events, table, before, bound)


def test_a_group_outside_the_manifest_fails_instead_of_being_skipped(archives, tmp_path):
    """A slice naming a group the manifest does not have would belong to no thread."""
    import shutil

    dest = str(tmp_path / "copy")
    shutil.copytree(archives["skewed"][0], dest)
    store = open_storage(dest)
    key = compacted.version_key(compacted.load_manifest(store).version)
    manifest = json.loads(store.read(key))
    for name in ("group_payload_bytes", "group_records", "group_file_bytes"):
        manifest[name] = manifest[name][:-1]
    manifest["groups"] -= 1
    store.write(key, compacted.dumps(manifest))
    with pytest.raises(reader.ReplayError, match="is not one of the manifest.s"):
        with reader.replay(dest, threads=3) as events:
            run(events)


def test_replay_options_come_one_way(archives):
    with pytest.raises(ValueError, match="not both"):
        reader.replay(archives["hot"][0], options=reader.ReplayOptions(threads=2), batch_size=10)
    with reader.replay(archives["hot"][0], options=reader.ReplayOptions(threads=3, batch_size=100)) as events:
        assert events.options.threads == 3 and run(events)[0]
