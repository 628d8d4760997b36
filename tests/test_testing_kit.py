"""keyfill.testing, the kit users test their own jobs with: it passes a job that only
depends on each key's records, and catches, with a shrunk example naming the record or key,
a job that depends on the order across keys, a replay without the barrier, and a replay
that loses or repeats a record."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

import reader
from keyfill.testing import (
    BackfillSettings,
    DifferentialError,
    Record,
    TopicArchive,
    Watermark,
    backfill_settings,
    check_job,
    keyfill_replay,
    late_in_partition,
    live_order,
    reference_stream,
    topic_archives,
)
from keyfill.testing.differential import job_order, memory_scratch, scratch
from keygroups.durations import parse_duration
from tests.records import sealed_slices

RELAXED = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def key_of(r) -> object:
    """Records without a key are in order per partition only (in Kafka as in keyfill)."""
    return r.key if r.key is not None else ("no key", r.partition)


def per_key_running_count(stream):
    """A job that depends on each key's records alone: their running count and total."""
    state: dict = {}
    for r in stream:
        n, total = state.get(key_of(r), (0, 0))
        state[key_of(r)] = (n + 1, total + len(r.value or b""))
        yield key_of(r), state[key_of(r)]


def global_sequence(stream):
    """A job that numbers records across keys: its outputs depend on how keys interleave."""
    for i, r in enumerate(stream):
        yield key_of(r), i


def tumbling_windows(stream, size_ms=10_000):
    """Per key, records per event-time window, emitted when the watermark passes the window."""
    open_: dict = {}
    for item in stream:
        if isinstance(item, Watermark):
            for key, start in sorted((w for w in open_ if w[1] + size_ms <= item.timestamp_ms), key=repr):
                yield key, (start, open_.pop((key, start)))
            continue
        w = (key_of(item), item.timestamp - item.timestamp % size_ms)
        open_[w] = open_.get(w, 0) + 1


def observed(seen: set):
    """keyfill's replay, as the kit runs it, with the (partition, offset) of every record it
    emits added to `seen` (the kit checks that they are its published records, each once)."""

    def replay(dest, settings):
        for ev in keyfill_replay(dest, settings):
            if isinstance(ev, reader.Records):
                seen.update(zip(ev.batch.column("partition").to_pylist(), ev.batch.column("offset").to_pylist()))
            yield ev

    return replay


def published_by_the_source(archive: TopicArchive, settings: BackfillSettings) -> set:
    """(partition, offset) of the records the kit's backfill must publish, from the topic
    alone: the sealed slices' (tests/records.py), or the whole topic where nothing is sealed
    yet (the kit then compacts with seal_all) or seal_all is asked for."""
    records = [(r.partition, r.offset, r.timestamp) for r in archive.records]
    if not records:
        return set()
    duration = parse_duration(settings.slice_duration)
    want = sealed_slices(records, duration, seal_all=settings.seal_all)
    return set((want or sealed_slices(records, duration, seal_all=True)).placed)


@settings(max_examples=60, **RELAXED)
@given(archive=topic_archives(), settings=backfill_settings())
def test_a_job_of_each_keys_records_gives_the_same_outputs_backfilled(archive, settings):
    seen: set = set()
    result = check_job(per_key_running_count, archive, settings, replay=observed(seen))
    published = published_by_the_source(archive, settings)
    assert seen == published and result.records == len(published)
    keys = len({key_of(r) for r in archive.records})
    assert (0 < result.keys <= keys) if result.records > result.late else result.keys == 0


@settings(max_examples=25, **RELAXED)
@given(archive=topic_archives(), settings=backfill_settings())
def test_a_windowed_job_under_watermarks_gives_the_same_windows(archive, settings):
    check_job(tumbling_windows, archive, settings, watermarks=True)


def test_scratch_archives_go_to_memory_where_the_os_has_room_and_are_removed():
    with scratch(None) as where:
        assert os.path.isdir(where)
        assert os.path.dirname(where) == (memory_scratch() or tempfile.gettempdir())
    assert not os.path.exists(where)
    assert memory_scratch() in (None, "/dev/shm")


def minimal_failure(check, examples: int = 200):
    """The smallest (archive, settings) on which `check` raises DifferentialError, by
    hypothesis' shrinking, and the error."""
    errors = []

    def fails(case) -> bool:
        try:
            check(*case)
        except DifferentialError as e:
            errors.append(e)
            return True
        return False

    # the archive is what shrinks; one thread, so the order across groups is the same on every run;
    # derandomized, so the search (and its time) is the same on every run too
    plain = BackfillSettings(groups=3, slice_duration="10s", threads=1)
    archive = find(
        topic_archives(records=st.integers(0, 40)),
        lambda a: fails((a, plain)),
        settings=settings(max_examples=examples, database=None, derandomize=True, **RELAXED),
    )
    try:
        check(archive, plain)
    except DifferentialError as e:
        return (archive, plain), str(e)
    raise AssertionError("the shrunk example no longer fails")


@pytest.mark.slow  # 14 s: the kit searches for the failing example
def test_a_job_that_depends_on_the_order_across_keys_is_flagged_naming_the_key():
    (archive, _), message = minimal_failure(lambda a, s: check_job(global_sequence, a, s))
    assert message.startswith("key ") and "outputs differ" in message
    assert len(archive.records) <= 5  # shrunk from up to 40: two keys whose records interleave otherwise


@settings(max_examples=15, **RELAXED)
@given(archive=topic_archives(partitions=st.integers(2, 4), records=st.integers(5, 60)), settings=backfill_settings())
def test_the_job_gets_the_same_order_each_time_an_example_runs(archive, settings):
    """A failing example must fail again when hypothesis runs it again (else it reports a
    flaky test, not the minimal topic): the job's order is drawn, not the threads' timing."""
    seen = []

    def job(stream):
        seen.append([(r.partition, r.offset) if isinstance(r, Record) else r.timestamp_ms for r in stream])
        return ()

    many = BackfillSettings(**{**vars(settings), "threads": 8, "groups": 9})
    for _ in range(3):
        check_job(job, archive, many, watermarks=True)
    assert seen[1] == seen[3] == seen[5]  # the backfill's runs (the reference's are 0, 2, 4)


@settings(deadline=None)
@given(
    stream=st.lists(st.one_of(st.tuples(st.integers(0, 3)), st.integers(0, 5)), max_size=60),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_job_order_keeps_each_groups_records_in_order_between_the_same_watermarks(stream, seed):
    # (group,) stands for a record of that key group, an int for a watermark
    events = [
        (Record(0, n, 0, None, b"", ()), None, x[0]) if isinstance(x, tuple) else Watermark(x)
        for n, x in enumerate(stream)
    ]
    got = job_order(events, seed)
    assert [x for x in got if isinstance(x, Watermark)] == [x for x in events if isinstance(x, Watermark)]
    for mine, theirs in zip(_split(got), _split(events), strict=True):
        assert sorted(r.offset for r in mine) == sorted(e[0].offset for e in theirs)
        for group in {e[2] for e in theirs}:
            offsets = [e[0].offset for e in theirs if e[2] == group]
            assert [r.offset for r in mine if r.offset in offsets] == offsets


def _split(items: list) -> list[list]:
    """The items between consecutive watermarks (watermarks dropped)."""
    out: list[list] = [[]]
    for x in items:
        if isinstance(x, Watermark):
            out.append([])
        else:
            out[-1].append(x)
    return out


def no_barrier(dest: str, settings: BackfillSettings):
    """A broken replay: each group read through all its slices before the next group, the
    watermark moved at each of its slice ends (what a reader without the barrier does)."""
    events = list(keyfill_replay(dest, settings))
    marks = {ev.slice: ev for ev in events if isinstance(ev, reader.Watermark)}
    pieces = [ev for ev in events if isinstance(ev, reader.Records)]
    for g in sorted({p.group for p in pieces}):
        for p in (p for p in pieces if p.group == g):
            yield p
            if p.slice in marks:
                yield marks[p.slice]


def test_a_replay_without_the_barrier_is_flagged_as_new_lateness():
    (archive, _), message = minimal_failure(lambda a, s: check_job(per_key_running_count, a, s, replay=no_barrier))
    assert message.startswith("new lateness: partition ") and "on time in its partition" in message
    assert len(archive.records) <= 4


def mutate(change):
    def replay(dest, settings):
        events = list(keyfill_replay(dest, settings))
        first = next((i for i, ev in enumerate(events) if isinstance(ev, reader.Records)), None)
        if first is not None:
            events[first : first + 1] = change(events[first])
        yield from events

    return replay


def test_a_lost_and_a_repeated_record_are_flagged():
    lose = mutate(lambda ev: [ev._replace(batch=ev.batch.slice(1))])
    (archive, _), message = minimal_failure(lambda a, s: check_job(per_key_running_count, a, s, replay=lose))
    assert message.startswith("the replay lost 1 record(s), the first partition ") and len(archive.records) == 1
    twice = mutate(lambda ev: [ev, ev])
    (archive, _), message = minimal_failure(lambda a, s: check_job(per_key_running_count, a, s, replay=twice))
    assert message.startswith("the replay emitted partition ") and message.endswith("twice (exactly once)")
    assert len(archive.records) == 1


def test_the_reference_merges_by_running_maximum_and_holds_the_watermark_for_producing_partitions():
    recs = [
        Record(0, 0, 1_000, b"a", b""),
        Record(0, 1, 5_000, b"a", b""),
        Record(0, 2, 2_000, b"a", b""),  # 3 s behind its partition's maximum
        Record(1, 0, 3_000, b"b", b""),
        Record(1, 1, 9_000, b"b", b""),
        Record(1, 2, 9_500, b"b", b""),
    ]
    assert [(r.partition, r.offset) for r in live_order(recs)] == [(0, 0), (1, 0), (0, 1), (0, 2), (1, 1), (1, 2)]
    assert late_in_partition(recs, 0) == {(0, 2)} and late_in_partition(recs, 3_000) == set()
    marks = [x.timestamp_ms for x in reference_stream(recs, 500) if isinstance(x, Watermark)]
    # after (1,0): min(1000, 3000) - 500; after (0,1): min(5000, 3000) - 500; partition 0 ends
    # with (0,2), then only partition 1 holds it: after (1,1) 9000 - 500; and the end of the stream
    assert marks == [500, 2_500, 8_500, 2**63 - 1]


@pytest.mark.parametrize("layout", ["envelope", "kafka-connect", "kafka-segments", "delta"])
def test_every_layout_backfills_what_it_holds(layout):
    archive = TopicArchive(
        "t",
        (
            tuple(Record(0, i, 1_000 * i, b"k%d" % (i % 3), b"v%d" % i, (("h", b"x"),)) for i in range(30)),
            tuple(Record(1, i, 1_500 * i, None, None, ()) for i in range(20)),
        ),
        chunk_records=7,
    )
    settings = BackfillSettings(layout=layout, groups=2, slice_duration="10s", threads=3, restarts=(3, 5))
    result = check_job(per_key_running_count, archive, settings)
    assert (result.records, result.late) == (50, 0)
