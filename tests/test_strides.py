"""Event-time pacing (`maxEventTimePerTrigger`, reader.strides): several keyfill sources of one
query, over archives of different sizes, slice lengths, gaps and first times, read the same
stride of event time in every micro-batch, and Spark's watermark over them (the minimum of
the inputs') drops no record that was not late in its own partition. The sources are driven
by hand as Spark's micro-batch loop drives them (no Spark session: planning and reading are
what is tested; tests/test_fraud_join.py runs a join in Spark)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_reader import hypothesis_settings
from test_time_bounds import archive, as_record

from keyfill.synth.topic import Record, TopicArchive
from keyfill.testing.strategies import topic_archives
from keygroups import compacted, handoff
from keygroups.storage import open_storage
from reader.spark import DataSourceOptionError, KeyfillStreamReader, Options


def run_together(opts: list[dict], restarts: set[int]) -> list[list[tuple[dict, dict, list[Record]]]]:
    """Spark's micro-batch loop over several sources of one query: each trigger asks every
    source for its latest offset and runs a batch if any moved; offsets pass through JSON as
    the checkpoint keeps them; at a batch in `restarts` every source is made anew (a restarted
    query). Returns, per batch, each source's (start, end, records)."""
    sources = [KeyfillStreamReader(Options.parse(o)) for o in opts]
    starts = [s.initialOffset() for s in sources]
    batches = []
    for n in itertools.count():
        assert n < 2_000, "the query does not end"
        ends = [json.loads(json.dumps(s.latestOffset(a, s.getDefaultReadLimit()))) for s, a in zip(sources, starts)]
        if ends == starts:
            return batches
        if n in restarts:
            sources = [KeyfillStreamReader(Options.parse(o)) for o in opts]
        rows = [
            [as_record(r) for p in s.partitions(a, e) for b in s.read(p) for r in b.to_pylist()] if a != e else []
            for s, a, e in zip(sources, starts, ends)
        ]
        batches.append(list(zip(starts, ends, rows)))
        starts = ends


def late_in_partition(topic: TopicArchive, bound_ms: int) -> set[Record]:
    """Records more than `bound_ms` behind their partition's running maximum before them."""
    late = set()
    for part in topic.partitions:
        top = None
        for r in part:
            if top is not None and r.timestamp < top - bound_ms:
                late.add(r)
            top = r.timestamp if top is None else max(top, r.timestamp)
    return late


def shifted(topic: TopicArchive, name: str, by_ms: int) -> TopicArchive:
    parts = tuple(tuple(r._replace(timestamp=r.timestamp + by_ms) for r in part) for part in topic.partitions)
    return TopicArchive(name, parts, topic.chunk_records)


@st.composite
def joined_topics(draw):
    """Two topics of one join: sizes, skew and gaps as topic_archives draws them, the second
    starting later (or earlier) by a drawn shift, each compacted at its own slice length."""
    records = st.integers(1, 70)
    first = draw(topic_archives(partitions=st.integers(1, 3), records=records, headers=False, topic="payments"))
    second = draw(topic_archives(partitions=st.integers(1, 3), records=records, headers=False, topic="logins"))
    second = shifted(second, "logins", draw(st.sampled_from([0, 4_000, 30_000, 300_000, -45_000])))
    slices = [draw(st.sampled_from(["1s", "2s", "5s"])) for _ in range(2)]
    stride = draw(st.sampled_from(["10s", "20 seconds"]))
    stamps = sorted(r.timestamp for t in (first, second) for r in t.records)
    start = draw(st.sampled_from([stamps[0] - 7_000, stamps[0], stamps[len(stamps) // 3]]))
    bound = draw(st.sampled_from([0, 500, 5_000]))
    restarts = set(draw(st.lists(st.integers(0, 40), max_size=3)))
    return (first, second), slices, stride, start, bound, restarts


@hypothesis_settings(40)
@given(case=joined_topics(), groups=st.integers(1, 3))
def test_paced_sources_read_one_stride_a_batch_and_drop_nothing_not_late_in_its_partition(
    case, groups, tmp_path_factory
):
    topics, slices, stride, start, bound, restarts = case
    urls = [
        archive(t, tmp_path_factory.mktemp(t.topic), groups=groups, slice_duration=d, seal_all=True)
        for t, d in zip(topics, slices)
    ]
    manifests = [compacted.load_manifest(open_storage(u)) for u in urls]
    opts = [{"path": u, "maxEventTimePerTrigger": stride, "startingTimestamp": str(start)} for u in urls]
    batches = run_together(opts, restarts)
    length = Options.parse(opts[0]).max_event_time_per_trigger

    # every source moves one stride a batch, the same stride in all, from the one holding the start
    for n, batch in enumerate(batches):
        for (a, e, _), m in zip(batch, manifests):
            if a == e:
                continue  # this source has read its archive: it stays where it is
            assert (a["stride"], e["stride"]) == (start // length + n, start // length + n + 1)
            for s in range(a["slice"], e["slice"]):  # whole slices, all within the stride
                lo, hi = m.bounds(s)
                assert a["stride"] * length <= lo and hi <= e["stride"] * length

    # each source delivers its topic's records from the start time on, once
    for t, m, i in zip(topics, manifests, range(2)):
        hand = handoff.offsets(m)
        want = []
        for part in t.partitions:
            first = next((r.offset for r in part if r.timestamp >= start), None)
            want += [r for r in part if first is not None and first <= r.offset < hand.get(r.partition, 0)]
        got = [r for batch in batches for r in batch[i][2]]
        assert sorted(got) == sorted(want)

    # Spark's watermark over the two inputs drops only records late in their own partition,
    # under either policy: `min` (the default: the least of the inputs' largest event time seen
    # minus the bound) and `max` (the greatest: where unpaced sources lose the slower one's
    # rows). As in Spark, an input that has seen no rows counts as 0; the watermark moves only
    # once some input has rows, and never goes back.
    late = set().union(*(late_in_partition(t, bound) for t in topics))
    for policy in (min, max):
        largest: list[int | None] = [None, None]
        watermark = None
        for n, batch in enumerate(batches):
            for i, (_, _, rows) in enumerate(batch):
                dropped = [r for r in rows if watermark is not None and r.timestamp < watermark]
                assert set(dropped) <= late, f"{policy.__name__}, batch {n}: {topics[i].topic} lost {dropped[:3]}"
            for i, (_, _, rows) in enumerate(batch):
                if rows:
                    largest[i] = max([r.timestamp for r in rows] + [x for x in [largest[i]] if x is not None])
            if any(x is not None for x in largest):
                now = policy(0 if x is None else x - bound for x in largest)
                watermark = now if watermark is None else max(watermark, now)


def test_pacing_options_are_checked(tmp_path):
    parts = (tuple(Record(0, i, 1_000 * i, b"k", b"v") for i in range(30)),)
    url = archive(TopicArchive("t", parts), tmp_path, groups=1, slice_duration="5s", seal_all=True)
    with pytest.raises(DataSourceOptionError, match="needs startingTimestamp"):
        Options.parse({"path": url, "maxEventTimePerTrigger": "10s"})
    with pytest.raises(DataSourceOptionError, match="maxEventTimePerTrigger and maxSlicesPerTrigger: set one"):
        Options.parse(
            {"path": url, "maxEventTimePerTrigger": "10s", "startingTimestamp": "0", "maxSlicesPerTrigger": "1"}
        )
    with pytest.raises(DataSourceOptionError, match="maxEventTimePerTrigger '10 minuts'"):
        Options.parse({"path": url, "maxEventTimePerTrigger": "10 minuts", "startingTimestamp": "0"})
    source = KeyfillStreamReader(Options.parse({"path": url, "maxEventTimePerTrigger": "7s", "startingTimestamp": "0"}))
    with pytest.raises(DataSourceOptionError, match="slices of 5000 ms"):
        source.initialOffset()
    unpaced = KeyfillStreamReader(Options.parse({"path": url})).initialOffset()
    paced = KeyfillStreamReader(Options.parse({"path": url, "maxEventTimePerTrigger": "10s", "startingTimestamp": "0"}))
    with pytest.raises(DataSourceOptionError, match="unpaced read"):
        paced.latestOffset(unpaced, paced.getDefaultReadLimit())


def test_paced_sources_go_live_each_at_its_own_hand_off(keyfill_kafka, tmp_path):
    """With kafka.* options each paced source switches to its topic once it has read its
    archive, whatever the other does; until then both read the same stride in every batch,
    and each topic's records come once, from the start time on, across a restart."""
    from test_kafka_live import archived, produce

    def topic(name: str, parts: int, n: int, first: int, step: int) -> TopicArchive:
        return TopicArchive(
            name,
            tuple(
                tuple(Record(p, i, first + step * i + 100 * p, b"u%d" % (i % 4), b"v") for i in range(n))
                for p in range(parts)
            ),
            6,
        )

    topics = (topic("payments", 2, 40, 10_000, 1_000), topic("logins", 1, 12, 21_000, 2_500))
    names = [produce(keyfill_kafka, t) for t in topics]
    urls = [
        archived(t, [cut] * len(t.partitions), tmp_path / t.topic, groups=2, slice_duration=d, seal_all=True)
        for t, cut, d in zip(topics, (0.5, 0.75), ("2s", "5s"))
    ]
    start = 12_000
    opts = [
        {"path": u, "maxEventTimePerTrigger": "10s", "startingTimestamp": str(start)}
        | {"kafka.bootstrap.servers": keyfill_kafka.bootstrap, "subscribe": name, "maxOffsetsPerTrigger": "9"}
        for u, name in zip(urls, names)
    ]
    batches = run_together(opts, restarts={3})
    assert sum(len(rows) for b in batches for a, e, rows in [b[0]] if "kafka" in e) == 40  # payments' live half
    for i, t in enumerate(topics):
        got = [r for batch in batches for r in batch[i][2]]
        assert sorted(got) == sorted(r for r in t.records if r.timestamp >= start)  # each once, archive then topic
        phases = ["live" if "kafka" in e else "archive" for a, e, _ in (b[i] for b in batches) if a != e]
        assert phases == sorted(phases) and "live" in phases
        live = [len(rows) for b in batches for a, e, rows in [b[i]] if "kafka" in e and a != e]
        assert max(live) <= 9  # maxOffsetsPerTrigger caps the live phase, paced or not
    for batch in batches:
        strides = {e["stride"] for a, e, _ in batch if a != e and "kafka" not in e}
        assert len(strides) <= 1  # sources still in their archives read the same stride
