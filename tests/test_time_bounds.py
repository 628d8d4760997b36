"""Backfills bounded in time (`startingTimestamp`, `endingTimestamp` and the by-partition forms):
exactly the records Spark's Kafka source would deliver from the same topic, once, in key
order, with no new lateness, across restarts. The expected records are computed here from
the topic's records alone (the first offset whose timestamp is at or after the time, per
partition), not from the archive's index. The stream is driven by hand, as Spark drives it
(no Spark session: planning and reading are what is tested)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_kafka_live import run_stream
from test_reader import hypothesis_settings

import reader
from compactor.errors import NothingSealed
from compactor.job import CompactConfig, compact
from keyfill.synth.topic import Record, TopicArchive, write_archive
from keyfill.testing.strategies import topic_archives
from keygroups import compacted, handoff
from keygroups.errors import OptionError
from keygroups.storage import open_storage
from reader.spark import DataSourceOptionError, KeyfillBatchReader, KeyfillStreamReader, Options


def first_at(records: list[Record], t: int | None, default: int) -> int:
    """The Kafka source's offset for time t in one partition: the first whose timestamp is at
    or after t (none: `default`, past the end)."""
    if t is None:
        return default
    return next((r.offset for r in records if r.timestamp >= t), default)


def expected(topic: TopicArchive, hand: dict[int, int], starting: dict, ending: dict) -> list[Record]:
    out = []
    for p, part in enumerate(topic.partitions):
        if not part:
            continue
        lo = first_at(list(part), starting.get(p), part[-1].offset + 1) if p in starting else part[0].offset
        hi = first_at(list(part), ending.get(p), part[-1].offset + 1)
        out += [r for r in part if lo <= r.offset < hi and r.offset < hand[p]]
    return out


def as_record(row: dict) -> Record:
    stamp = round(row["timestamp"].timestamp() * 1000)
    return Record(row["partition"], row["offset"], stamp, row["key"], row["value"])


def run(opts: dict, restarts: set[int], limit=None) -> list[list[dict]]:
    """Each micro-batch's rows, as Spark's loop (test_kafka_live.run_stream) hands them over."""
    return [rows for _, rows in run_stream(opts, restarts, limit)]


def replayed(url: str, times: dict, stop_after: int) -> list[Record]:
    """The replay's records, stopped after `stop_after` watermarks and resumed from its checkpoint."""
    got = []
    with reader.replay(url, threads=2, **times) as events:
        marks = 0
        for ev in events:
            if isinstance(ev, reader.Records):
                got += [as_record(r) for r in ev.batch.to_pylist()]
            else:
                marks += 1
                if marks == stop_after:
                    state = events.checkpoint()
                    break
        else:
            return got
    with reader.replay(url, threads=3, resume=state, **times) as events:
        got += [as_record(r) for ev in events if isinstance(ev, reader.Records) for r in ev.batch.to_pylist()]
    return got


@st.composite
def bounded_reads(draw):
    topic = draw(topic_archives(partitions=st.integers(1, 3), records=st.integers(1, 90), headers=False))
    stamps = sorted(r.timestamp for r in topic.records)
    lo, hi = stamps[0] - 3_000, stamps[-1] + 3_000
    parts = [p for p, part in enumerate(topic.partitions) if part]

    def times():
        kind = draw(st.sampled_from(["none", "one", "per partition"]))
        if kind == "none":
            return None, {}
        if kind == "one":
            t = draw(st.integers(lo, hi) | st.sampled_from(stamps))
            return t, dict.fromkeys(range(len(topic.partitions)), t)
        per = {p: draw(st.integers(lo, hi) | st.sampled_from(stamps)) for p in range(len(topic.partitions))}
        return per, per

    start, starting = times()
    end, ending = times()
    limit = draw(st.sampled_from([{}, {"maxSlicesPerTrigger": "2"}, {"maxOffsetsPerTrigger": "7"}]))
    compaction = {
        "groups": draw(st.integers(1, 4)),
        "slice_duration": draw(st.sampled_from(["1s", "2s", "5s"])),
        "seal_all": draw(st.booleans()),
    }
    restarts = set(draw(st.lists(st.integers(0, 12), max_size=3)))
    assert parts
    return topic, start, end, starting, ending, limit, compaction, restarts


def options(url: str, topic: str, start, end) -> dict:
    out = {"path": url}
    for name, value in (("starting", start), ("ending", end)):
        if isinstance(value, int):
            out[f"{name}Timestamp"] = str(value)
        elif isinstance(value, dict):
            out[f"{name}OffsetsByTimestamp"] = json.dumps({topic: {str(p): t for p, t in value.items()}})
    return out


def archive(topic: TopicArchive, root, **compaction) -> str:
    src, dest = str(root / "src"), str(root / "compacted")
    try:
        compact(CompactConfig(**write_archive(topic, src), dest=dest, **compaction))
    except NothingSealed:
        compact(CompactConfig(source=src, source_format="envelope", dest=dest, **(compaction | {"seal_all": True})))
    return dest


@hypothesis_settings(60)
@given(case=bounded_reads())
def test_a_bounded_backfill_delivers_the_kafka_sources_records_once_in_key_order_without_new_lateness(
    case, tmp_path_factory
):
    topic, start, end, starting, ending, limit, compaction, restarts = case
    url = archive(topic, tmp_path_factory.mktemp("a"), **compaction)
    manifest = compacted.load_manifest(open_storage(url))
    want = expected(topic, handoff.offsets(manifest), starting, ending)
    batches = run(options(url, topic.topic, start, end) | limit, restarts)
    got = [as_record(r) for b in batches for r in b]
    assert sorted(got) == sorted(want)  # exactly those records, each once
    assert len(set(got)) == len(got)
    by_key: dict = {}
    for r in got:  # each key's records in offset order (a key is in one partition)
        by_key.setdefault((r.partition, r.key), []).append(r.offset)
    assert all(offs == sorted(offs) for offs in by_key.values())
    # no new lateness: a record below the event time every earlier batch reached was below
    # its own partition's running maximum among the records delivered before it
    seen_max, running = None, {}
    for b in batches:
        rows = [as_record(r) for r in b]
        for r in sorted(rows, key=lambda r: (r.partition, r.offset)):
            if seen_max is not None and r.timestamp < seen_max:
                assert r.timestamp < running.get(r.partition, r.timestamp), f"{r} made late"
            running[r.partition] = max(running.get(r.partition, r.timestamp), r.timestamp)
        if rows:
            seen_max = max(seen_max or rows[0].timestamp, max(r.timestamp for r in rows))
    if not isinstance(start, dict) and not isinstance(end, dict):  # the replay: the same, resumed halfway
        times = {"starting_timestamp": start, "ending_timestamp": end}
        assert sorted(replayed(url, times, stop_after=len(restarts))) == sorted(want)
    batch_read = KeyfillBatchReader(Options.parse(options(url, topic.topic, start, end)))
    rows = [as_record(r) for p in batch_read.partitions() for b in batch_read.read(p) for r in b.to_pylist()]
    assert sorted(rows) == sorted(want)  # spark.read: the same records


def test_bounds_plan_only_the_slices_that_can_hold_them(tmp_path):
    """A three-slice window of a long archive plans those slices, not the archive."""
    parts = (tuple(Record(0, i, 1_000 * i, b"k%d" % (i % 3), b"v") for i in range(100)),)
    url = archive(TopicArchive("t", parts), tmp_path, groups=2, slice_duration="10s", seal_all=True)
    reader = KeyfillStreamReader(Options.parse({"path": url, "startingTimestamp": "35000", "endingTimestamp": "61000"}))
    first = reader.initialOffset()
    assert first["slice"] == 3  # [30 s, 40 s) holds 35 s
    last = reader.latestOffset(first, reader.getDefaultReadLimit())
    assert last["slice"] == 7  # [60 s, 70 s) holds the first record at 61 s: the end
    rows = [r for p in reader.partitions(first, last) for b in reader.read(p) for r in b.to_pylist()]
    assert sorted(r["offset"] for r in rows) == list(range(35, 61))
    assert reader.latestOffset(last, reader.getDefaultReadLimit()) == last  # and the stream ends


def test_time_options_are_checked(tmp_path):
    parts = tuple(tuple(Record(p, i, 1_000 * i, b"k", b"v") for i in range(20)) for p in range(2))
    url = archive(TopicArchive("t", parts), tmp_path, groups=1, slice_duration="5s", seal_all=True)
    with pytest.raises(OptionError, match="missing: 1"):
        KeyfillStreamReader(
            Options.parse({"path": url, "startingOffsetsByTimestamp": '{"t": {"0": 5000}}'})
        ).initialOffset()
    with pytest.raises(OptionError, match="names topic .u."):
        KeyfillStreamReader(
            Options.parse({"path": url, "endingOffsetsByTimestamp": '{"u": {"0": 1, "1": 1}}'})
        ).initialOffset()
    with pytest.raises(DataSourceOptionError, match="startingOffsetsByTimestamp='x'"):
        Options.parse({"path": url, "startingOffsetsByTimestamp": "x"})
    with pytest.raises(DataSourceOptionError, match="startingSlice and startingTimestamp"):
        Options.parse({"path": url, "startingSlice": "2", "startingTimestamp": "5"})
    with pytest.raises(DataSourceOptionError, match="takes 'earliest' only"):
        Options.parse({"path": url, "startingOffsets": '{"t": {"0": 4}}'})
    assert Options.parse({"path": url, "startingOffsets": "earliest", "endingOffsets": "latest"})


def test_max_offsets_per_trigger_bounds_archive_batches_in_whole_slices(tmp_path):
    parts = tuple(tuple(Record(p, i, 500 * i, b"k%d" % (i % 5), b"v") for i in range(60)) for p in range(2))
    url = archive(TopicArchive("t", parts), tmp_path, groups=3, slice_duration="2s", seal_all=True)
    batches = run({"path": url, "maxOffsetsPerTrigger": "17"}, set())
    sizes = [len(b) for b in batches]
    assert sum(sizes) == 120 and all(n <= 17 for n in sizes)  # 2 s slices hold 8 records: 2 a batch
    assert all({r["slice"] for r in a}.isdisjoint({r["slice"] for r in b}) for a, b in zip(batches, batches[1:]))
    one = run({"path": url, "maxOffsetsPerTrigger": "1"}, set())
    assert [len(b) for b in one] == [8] * 15  # at least one whole slice, however many records
