"""The compaction job: list, statistics, packing, slicing, rewrite, commit.

Spark runs both passes over the source (`compactor.statistics`, `compactor.rewrite`); every
byte of I/O happens in Python tasks through keyfill's storage layer (pip pyspark has
neither spark-avro nor s3a), so a cluster needs only Python packages. The driver sees
per-key totals and per-chunk summaries, never records.

Commit protocol (`compactor.commit`): every file the run writes is named by its run id;
segment files and the piece index are written first, the version object last, created
once (`Storage.create`). Without it the run's files are invisible, so a run that dies
part-way leaves the archive as it was (or none), a re-run simply writes anew, and of two
runs racing for one version exactly one commits. --overwrite replaces nothing in place: the
new version is built beside the old one, whose readers keep reading it
(`compactor.destination`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compactor import slice_length
from compactor.append import carry_over, continuation, continuing, extend_assignment
from compactor.chunks import chunks_from
from compactor.commit import file_sizes, write_manifest
from compactor.config import Analysis, CompactConfig, CompactResult, Prepared
from compactor.destination import check_destination
from compactor.errors import CompactionError, HeldBack
from compactor.execution import Execution, Rows, for_session
from compactor.executor_access import check_executors_reach
from compactor.history import check_history
from compactor.lease import Lease, take_lease
from compactor.rewrite import rewrite_groups
from compactor.slicing import SlicePlan, plan_slices
from compactor.sources import SourceArchive, SourceChunk
from compactor.statistics import KeySplit, statistics_pass
from compactor.task_errors import TaskErrors
from keygroups import compacted, envelope
from keygroups.assignment import (
    assignment_keys,
    bucket_count,
    bucket_rows,
    exact_limit,
    exact_rows,
    heavy_threshold,
    is_bucket,
    load_assignment,
    write_assignment,
)
from keygroups.errors import OptionError
from keygroups.storage import open_storage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["CompactConfig", "CompactResult", "CompactionError", "Prepared", "compact", "prepare"]

log = logging.getLogger("keyfill.compact")


def list_topic_chunks(source: SourceArchive, topic: str | None) -> tuple[str, list[SourceChunk]]:
    """The chosen topic and its chunks (the topic may be left out when there is only one)."""
    chunks = source.list_chunks()
    if not chunks:
        raise envelope.CorruptFile(f"{source.url}: no chunks found")
    topics = sorted({c.topic for c in chunks})
    topic = topic or (topics[0] if len(topics) == 1 else None)
    if topic is None or topic not in topics:
        raise OptionError(f"{source.url}: holds topics {topics}; choose one with --topic")
    return topic, [c for c in chunks if c.topic == topic]


MIN_GROUPS, MAX_GROUPS = 16, 1024


def default_groups(payload: int, keys: int, target_file_bytes: int) -> int:
    """`--groups` when not given: one group per 4 target files of payload (so a group's
    segments are full-size files after compression), as a power of two, at least 16 (the
    replay's default thread count: every thread gets a group) and at most 1,024 (past
    that, the index grows by a row per group per slice and a replay's read-ahead is split
    too thin), never more than there are keys."""
    wanted = max(1, -(-payload // (4 * target_file_bytes)))
    groups = min(MAX_GROUPS, max(MIN_GROUPS, 1 << (wanted - 1).bit_length()))
    return max(1, min(groups, keys))


def packed_assignment(totals: pa.Table, groups: int, buckets: pa.Table | None = None) -> pa.Table:
    """Exact entries for `totals`' keys and, if given, one row per bucket, packed together as
    items (docs/packing.md)."""
    import keygroups

    totals = totals.sort_by([("null_part", "ascending"), ("key", "ascending")])  # canonical order
    rows = exact_rows(totals)
    if buckets is not None:
        rows = pa.concat_tables([rows, bucket_rows(buckets)])
    assigned = keygroups.pack(rows.column("bytes").to_numpy(), groups)
    return rows.set_column(rows.schema.get_field_index("group"), "group", pa.array(assigned, pa.int32()))


def prepare(cfg: CompactConfig, *, dry_run: bool = False) -> Prepared:
    """Open the source and the destination, refuse what would destroy data, list the chunks,
    and take the run's lease (the first write: it proves the destination is writable; a
    dry run writes nothing)."""
    t = time.perf_counter()
    source = cfg.open_source()
    dest = open_storage(cfg.dest, threads=cfg.threads)
    parent = check_destination(source, dest, cfg.overwrite, append=cfg.append)
    grows = compacted.load_manifest(dest, parent) if cfg.append and parent is not None else None
    start = None
    if grows is not None:
        cfg, start = continuing(cfg, grows, source), continuation(grows)
        source = cfg.open_source()  # with the archive's source options
        log.info("appending to version %d of %s from its hand-off offsets", grows.version, dest.url)
    elif cfg.append:
        log.info("no archive at %s yet: --append starts it with a full compaction", dest.url)
    topic, listed = list_topic_chunks(source, cfg.topic)
    chunks = listed if start is None else chunks_from(listed, start.handoff)
    log.info("%d chunks of topic %s in %s", len(chunks), topic, source.url)
    run = compacted.new_run()
    lease = None if dry_run else take_lease(dest, run, "compact" if start is None else "append")
    return Prepared(cfg, source, dest, parent, grows, topic, listed, chunks, start, run, lease, time.perf_counter() - t)


HELD_BACK_WARNING = 0.05  # a share of the run's records held back that is worth a warning


def check_held_back(plan: SlicePlan, limit: float | None, url: str) -> None:
    """Say loudly how many records this run leaves for later and why (or refuse, over
    `limit`): a compaction that publishes a sliver of its source and exits 0 looks like a
    success to a script."""
    if not plan.withheld:
        return
    published = sum(r.records for rs in plan.ranges.values() for r in rs)
    share = plan.withheld / (published + plan.withheld)
    why = (
        f"partition {plan.seal_holder}'s running maximum is still in slice {plan.base + plan.slices} (absolute), so "
        "later records may belong to the slices from there on; they are published once every partition has passed "
        "them (append later), or now with --seal-all (a topic that will not grow) or --idle-after (quiet partitions)"
    )
    message = f"{plan.withheld:,} of {published + plan.withheld:,} records ({share:.1%}) of {url} held back: {why}"
    if limit is not None and share > limit:
        raise HeldBack(f"{message}; more than --max-held-back {limit:g}, so nothing is committed")
    if share > HELD_BACK_WARNING:
        log.warning(message)
    else:
        log.info(message)


def compact(cfg: CompactConfig, spark: SparkSession | None = None, prepared: Prepared | None = None) -> CompactResult:
    """Run the whole compaction on `spark`; returns the summary. Raises on any bad input
    with a message naming the object at fault, leaving no visible archive. `prepared`: the
    run's `prepare(cfg)`, when the caller checked before starting Spark.

    `spark=None` runs the same tasks in this process, with the whole archive in memory: for
    small archives (tests, `keyfill.testing`), where a Spark job's fixed cost of ~1.5 s per
    compaction is most of the time. The files are byte for byte those Spark writes."""
    prepared = prepared or prepare(cfg)
    lease = prepared.lease
    if lease is None:  # a dry run's (keyfill plan), which writes nothing
        raise ValueError("compact() needs the run's lease: prepare(cfg), not prepare(cfg, dry_run=True)")
    with prepared.abandoned_on_error():
        execution = for_session(spark, TaskErrors(prepared.dest, prepared.run))
        try:
            result = _compact(prepared, lease, execution)
        finally:
            execution.close()
    lease.release(failed=False)
    return result


class PhaseClock:
    """The time of each phase of a run, into `phases` (what `CompactResult.phases` reports):
    each `done(name)` takes the time since the one before."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases = phases
        self._since = time.perf_counter()

    def done(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = now - self._since
        self._since = now


def analyse(prepared: Prepared, execution: Execution[Rows], phases: dict[str, float]) -> Analysis:
    """The history check of an append, the statistics pass, the slice length, the slices
    and the packing; `phases` gets their times."""
    cfg, source, dest, grows = prepared.cfg, prepared.source, prepared.dest, prepared.grows
    start, chunks = prepared.start, prepared.chunks

    clock = PhaseClock(phases)
    if not execution.shares_environment:
        check_executors_reach(execution, source, chunks, dest, None if prepared.lease is None else prepared.run)
    if grows is not None:
        check_history(execution, source, prepared.listed, grows)
        clock.done("history")
    derived = cfg.slice_duration is None
    stats_ms = slice_length.STATS_MS if derived else cfg.slice_duration_ms
    old, fixed = (None, cfg.groups) if grows is None else (load_assignment(dest, grows.assignment), grows.groups)

    def groups_for(keys: int, payload: int) -> int:
        return fixed or default_groups(payload, keys, cfg.target_file_bytes)

    def split(keys: int, payload: int) -> KeySplit:
        """Exact entries for every key while they are few; past that, heavy keys exact and
        hashed buckets for the rest. An append follows the archive's own rule."""
        if old is not None:
            bucketed = is_bucket(old)
            if not bucketed.any():
                return KeySplit()
            exact = old.filter(pa.array(~bucketed))
            return KeySplit(buckets=int(bucketed.sum()), known=exact.column("key").drop_null().combine_chunks())
        groups = groups_for(keys, payload)
        limit = exact_limit(groups) if cfg.exact_keys is None else cfg.exact_keys
        if keys <= limit:  # `keys` may be a lower bound: every key exact while they are no more than `limit`
            return KeySplit(limit=limit)
        return KeySplit(buckets=bucket_count(groups), threshold=heavy_threshold(payload, groups))

    stats = statistics_pass(execution, source, chunks, stats_ms, prepared.handoff, split)
    clock.done("statistics")
    groups = groups_for(stats.keys, stats.payload)
    if stats.buckets is not None:
        largest = int(pc.max(stats.buckets.column("bytes")).as_py() or 0)
        log.info(
            "%s distinct keys: %s heavy keys get entries, the rest %s hash buckets, the largest bucket %.2f%% of a "
            "mean group (what bucketing may cost the balance at most; docs/packing.md)",
            f"{stats.keys:,}",
            f"{stats.totals.num_rows:,}",
            f"{stats.buckets.num_rows:,}",
            100 * largest * groups / max(stats.payload, 1),
        )
    if derived:
        payload = stats.payload
        chosen = slice_length.derive(payload, slice_length.extent_ms_of(stats.chunks), groups)
        cfg = dataclasses.replace(cfg, slice_duration=chosen)
        stats = dataclasses.replace(stats, chunks=slice_length.coarsen(stats.chunks, cfg.slice_duration_ms))
        log.info(
            "slices of %s (derived: the shortest with %d KiB of payload per group on average, at most %s; "
            "--slice-duration sets it)",
            chosen,
            slice_length.MIN_PIECE_BYTES >> 10,
            slice_length.MAX_DERIVED,
        )

    plan = plan_slices(
        stats.chunks,
        cfg.slice_duration_ms,
        allow_gaps=cfg.allow_gaps or source.gaps_vetted,
        expect_gaps=not source.contiguous,
        seal_all=cfg.seal_all,
        idle_after_ms=cfg.idle_after_ms,
        after=start,
        name=source.store.url_for,
    )
    check_held_back(plan, None if prepared.lease is None else cfg.max_held_back, source.url)
    if old is not None:
        assignment, new_keys = extend_assignment(old, stats.totals, groups, stats.buckets)
    else:
        assignment = packed_assignment(stats.totals, groups, stats.buckets)
        new_keys = assignment_keys(assignment)
    clock.done("packing")
    return Analysis(cfg, stats, plan, groups, assignment, new_keys)


def _compact(prepared: Prepared, lease: Lease, execution: Execution[Rows]) -> CompactResult:
    """The phases after `prepare`, each handed the run's state (`Prepared`, `Analysis`,
    what an append carries over) and the execution; the summary from what was committed."""
    started = time.perf_counter() - prepared.list_seconds
    phases: dict[str, float] = {"list": prepared.list_seconds}
    found = analyse(prepared, execution, phases)
    lease.set_groups(found.groups)
    write_assignment(prepared.dest, prepared.assignment_key, found.assignment)
    clock = PhaseClock(phases)
    carry = carry_over(prepared, found)
    pieces = rewrite_groups(prepared, found, carry, execution)
    clock.done("rewrite")
    manifest = write_manifest(prepared, found, carry, pieces)
    clock.done("commit")

    plan = found.plan
    group_bytes = np.asarray(manifest.group_payload_bytes)  # as the manifest sums them
    return CompactResult(
        dest=prepared.dest.url,
        records=manifest.totals.records,
        payload_bytes=manifest.totals.payload_bytes,
        file_bytes=manifest.totals.file_bytes,
        files=manifest.totals.files,
        pieces=manifest.totals.pieces,
        groups=found.groups,
        slices=plan.slices,
        empty_slices=manifest.totals.empty_slices,
        keys=manifest.totals.keys,
        max_group_bytes=int(group_bytes.max()),
        mean_group_bytes=float(group_bytes.mean()),
        seconds=time.perf_counter() - started,
        replay_gets=compacted.replay_gets(file_sizes(pieces)),
        range_bytes=compacted.GET_BYTES,
        phases=phases,
        version=manifest.version,
        withheld=plan.withheld,
        kind=manifest.kind,
        first_slice=plan.first,
        new_records=int(pieces.column("records").to_numpy().sum()) if pieces.num_rows else 0,
        new_keys=found.new_keys,
        made_late=plan.made_late,
        idle=plan.idle,
        run=prepared.run,
        archive=manifest.archive,
    )
