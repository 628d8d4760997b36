"""The differential check: a job fed by keyfill's backfill against the same job fed the
topic as a live consumer reads it (`keyfill.testing.reference`).

Per example: write the drawn topic in the drawn layout, compact it (in this process: the
same tasks and bytes as Spark, `compactor.job.compact(spark=None)`), replay it with the
drawn threads, stopping at the drawn points, checkpointing and resuming, and check

1. exactly once: the replay emits every record the archive publishes, once;
2. per-key order: each key's records in offset order;
3. no new lateness: a record after a replay watermark it is behind is late in its own
   partition by more than the bound;
4. watermarks never go back;
5. the job's outputs per key are equal. Records late in their partition are taken out of
   both streams first: where they land is the one thing that legitimately depends on the
   read order (a live job's watermark may accept them or not), and each stream's
   watermark accepts all the others.

A failure raises `DifferentialError` (an AssertionError, so hypothesis shrinks it) naming
the first record or key at fault.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import tempfile
import uuid
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keyfill.synth.topic import Record, TopicArchive, write_archive
from keyfill.testing.reference import MAX_WATERMARK, Watermark, late_in_partition, records_of, reference_stream
from keyfill.testing.strategies import BackfillSettings, untraced

Job = Callable[[Iterable[Any]], Iterable[tuple[Hashable, Any]]]
Replay = Callable[[str, BackfillSettings], Iterable[Any]]
# A replay's record (the watermark it came under, its key group), or a watermark.
Emitted = tuple[Record, int | None, int] | Watermark
Outputs = Mapping[Hashable, Sequence[Any]]  # a job's outputs, by key


class DifferentialError(AssertionError):
    """The backfill and the reference disagree (the message names the record or key)."""


@dataclass(frozen=True)
class Backfill:
    """A compacted example: where its archive lives and what it publishes."""

    source: str
    dest: str | None  # None: the topic is empty
    records: list[Record]  # the published records (below the hand-off), each partition in offset order


def compact_example(archive: TopicArchive, settings: BackfillSettings, url: str | None = None) -> Backfill:
    """Write `archive` under `url` (a fresh temporary folder when None; a unique prefix is
    added) and compact it with `settings`."""
    from compactor.errors import SlicingError
    from compactor.job import CompactConfig, compact
    from keygroups import compacted
    from keygroups.storage import open_storage

    url = url or tempfile.mkdtemp(prefix="keyfill-testing-", dir=memory_scratch())
    root = url.rstrip("/") + f"/{uuid.uuid4().hex[:10]}"
    source = write_archive(archive, root + "/source", settings.layout)
    dest = root + "/compacted"
    if not archive.records:  # nothing to compact (keyfill refuses an empty source): nothing to replay
        return Backfill(source["source"], None, [])
    cfg = dict(
        source,
        dest=dest,
        groups=settings.groups,
        slice_duration=settings.slice_duration,
        seal_all=settings.seal_all,
        codec="null",
    )
    log = logging.getLogger("keyfill")
    level = log.level
    log.setLevel(logging.ERROR)  # a held-back share is the point of seal_all=False here, not news
    try:
        compact(CompactConfig(**cfg))
    except SlicingError:  # so small a topic may have no sealed slice yet: backfill it whole
        compact(CompactConfig(**{**cfg, "seal_all": True}))
    finally:
        log.setLevel(level)
    handoff = compacted.load_manifest(open_storage(dest)).handoff
    published = [r for r in archive.records if r.offset < handoff.get(r.partition, 0)]
    return Backfill(source["source"], dest, _read_back(source, published))


def _read_back(source: dict[str, Any], published: list[Record]) -> list[Record]:
    """The published records as keyfill's source reader reads them (a layout may change the
    value: Connect values become JSON text)."""
    from compactor.sources import open_source

    wanted = {(r.partition, r.offset) for r in published}
    src = open_source(source["source"], format=source["source_format"], options=source.get("source_options"))
    out = []
    for chunk in src.list_chunks():
        out += [r for r in records_of(src.read(chunk)) if (r.partition, r.offset) in wanted]
    return sorted(out, key=lambda r: (r.partition, r.offset))


def keyfill_replay(dest: str, settings: BackfillSettings) -> Iterator[Any]:
    """keyfill's replay events (`reader.Records`, `reader.Watermark`) over `dest`, stopped
    after each of `settings.restarts` events, checkpointed and resumed by a new replay."""
    import reader

    options = dict(
        threads=settings.threads,
        batch_size=settings.batch_size,
        watermark_bound_ms=settings.watermark_bound_ms,
        max_drift_ms=settings.max_drift_ms,
    )
    state = None
    for stop in [*settings.restarts, None]:
        with reader.replay(dest, resume=state, **options) as events:
            n = 0
            for ev in events:
                yield ev
                n += 1
                if stop is not None and n >= stop:
                    state = events.checkpoint()
                    break
            else:
                return


def replay_stream(events: Iterable[Any]) -> list[Emitted]:
    """Replay events as (record, the watermark it was emitted under, its key group) and
    `Watermark`s."""
    import reader

    out: list[Emitted] = []
    mark = None
    for ev in events:
        if isinstance(ev, reader.Watermark):
            mark = ev.timestamp_ms
            out.append(Watermark(ev.timestamp_ms))
        elif isinstance(ev, reader.Records):
            out += [(r, mark, ev.group) for r in records_of(ev.batch)]
    return out


def job_order(stream: list[Emitted], seed: int) -> list[Record | Watermark]:
    """The replay's records in the order the job gets them: between two watermarks, the key
    groups' records merged in an order drawn from `seed`, each group's in the replay's order.
    The replay's threads may deliver any such order; drawing it, rather than taking the one
    the threads' timing gave, makes a failing example fail again when hypothesis runs it
    again, which its shrinking needs (a bug seen once and then not is reported as flaky)."""
    rng = random.Random(seed)
    out: list[Record | Watermark] = []
    groups: dict[int, list[Record]] = {}
    for item in [*stream, None]:
        if isinstance(item, tuple):
            groups.setdefault(item[2], []).append(item[0])
            continue
        picks = [g for g in sorted(groups) for _ in groups[g]]  # sorted: not in the order the threads came
        rng.shuffle(picks)
        each = {g: iter(records) for g, records in groups.items()}
        out += [next(each[g]) for g in picks]
        groups = {}
        if item is not None:
            out.append(item)
    return out


def _name(r: Record) -> str:
    return f"partition {r.partition} offset {r.offset} (timestamp {r.timestamp}, key {r.key!r})"


def check_stream(stream: list[Emitted], published: list[Record], bound_ms: int) -> set[tuple[int, int]]:
    """Checks 1-4 on a replay stream; returns the records late in their partition."""
    late = late_in_partition(published, bound_ms)
    want = {(r.partition, r.offset): r for r in published}
    seen: set[tuple[int, int]] = set()
    last: dict[tuple[bytes | None, int], int] = {}  # by key and partition
    mark = None
    for item in stream:
        if isinstance(item, Watermark):
            if mark is not None and item.timestamp_ms < mark:
                raise DifferentialError(f"the replay's watermark went back from {mark} to {item.timestamp_ms}")
            mark = item.timestamp_ms
            continue
        r, under = item[0], item[1]
        at = (r.partition, r.offset)
        if at not in want:
            raise DifferentialError(f"the replay emitted {_name(r)}, a record the archive does not publish")
        if at in seen:
            raise DifferentialError(f"the replay emitted {_name(r)} twice (exactly once)")
        seen.add(at)
        k = (r.key, r.partition)
        if last.get(k, -1) > r.offset:
            raise DifferentialError(f"{_name(r)} came after offset {last[k]} of its key (per-key order)")
        last[k] = r.offset
        if under is not None and r.timestamp < under and at not in late:
            raise DifferentialError(
                f"new lateness: {_name(r)} came after the replay's watermark {under}, but it is on time in its "
                f"partition (bound {bound_ms} ms)"
            )
    missing = [r for at, r in want.items() if at not in seen]
    if missing:
        raise DifferentialError(f"the replay lost {len(missing)} record(s), the first {_name(missing[0])}")
    return late


def _outputs(job: Job, items: list[Record | Watermark], watermarks: bool) -> dict[Hashable, list[Any]]:
    out: dict[Hashable, list[Any]] = {}
    for key, value in job(x for x in items if watermarks or not isinstance(x, Watermark)):
        out.setdefault(key, []).append(value)
    return out


def compare_outputs(reference: Outputs, backfill: Outputs, *, order: Sequence[Hashable] | None = None) -> None:
    """Per key, the same outputs in the same order; the first key that differs is named."""
    keys = list(dict.fromkeys([*(order or []), *reference, *backfill]))
    for key in keys:
        a, b = reference.get(key, []), backfill.get(key, [])
        if a != b:
            raise DifferentialError(
                f"key {key!r}: the job's outputs differ.\n  fed the topic in partition order: {a!r}\n"
                f"  fed keyfill's backfill:           {b!r}"
            )


# A search compacts hundreds of tiny topics, and on a disk that other processes write to
# (Spark's shuffles beside a test run) each file's fsync costs more than its compaction.
MEMORY_FS = "/dev/shm"
MEMORY_FS_ROOM = 1 << 30  # free bytes it must have: a container's default 64 MB is too tight


def memory_scratch() -> str | None:
    """Where temporary archives go: the memory filesystem where the OS mounts one with room
    to spare, else None (the system's temporary folder)."""
    try:
        fs = os.statvfs(MEMORY_FS)
    except OSError:
        return None
    roomy = fs.f_bavail * fs.f_frsize >= MEMORY_FS_ROOM and os.access(MEMORY_FS, os.W_OK)
    return MEMORY_FS if roomy else None


@contextlib.contextmanager
def scratch(url: str | None) -> Iterator[str]:
    """`url`, or a temporary folder removed afterwards (a test session runs hundreds of
    examples: their archives must not pile up)."""
    if url is not None:
        yield url
        return
    with tempfile.TemporaryDirectory(prefix="keyfill-testing-", dir=memory_scratch()) as tmp:
        yield tmp


@dataclass(frozen=True)
class CheckResult:
    records: int  # published and compared
    late: int  # late in their partition, taken out before the job ran
    keys: int  # keys with outputs
    outputs: int


def check_job(
    job: Job,
    archive: TopicArchive,
    settings: BackfillSettings,
    *,
    url: str | None = None,
    watermarks: bool = False,
    replay: Replay | None = None,
) -> CheckResult:
    """Run `job` over the topic in live order and over keyfill's backfill of it, and check
    both (see the module's docstring).

    Args:
        job: `job(stream)` yields (key, output) pairs; `stream` holds `Record`s in delivery
            order (and `Watermark`s with `watermarks=True`, the last one `MAX_WATERMARK`).
        archive: the topic, as the kit's strategies draw it (`topic_archives()`).
        settings: how it is compacted and replayed (`backfill_settings()`).
        url: where the archives go (a folder, or an s3://, gs:// or az:// prefix; a
            temporary folder by default).
        watermarks: hand the job watermarks too.
        replay: the events to check instead of keyfill's replay (to test the kit itself).

    Returns a CheckResult; raises DifferentialError naming the first record or key at fault.
    """
    bound = settings.watermark_bound_ms
    with untraced(), scratch(url) as where:
        done = compact_example(archive, settings, where)
        stream = replay_stream((replay or keyfill_replay)(done.dest, settings)) if done.dest else []
        late = check_stream(stream, done.records, bound)
        on_time = [r for r in done.records if (r.partition, r.offset) not in late]
        reference = reference_stream(on_time, bound)
    backfill = job_order(stream, settings.interleaving)
    backfill = [x for x in backfill if isinstance(x, Watermark) or (x.partition, x.offset) not in late]
    backfill.append(Watermark(MAX_WATERMARK))
    ref_out = _outputs(job, reference, watermarks)
    compare_outputs(ref_out, _outputs(job, backfill, watermarks))
    return CheckResult(len(done.records), len(late), len(ref_out), sum(map(len, ref_out.values())))
