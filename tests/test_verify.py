"""The audit (`keyfill verify`) is one set of checks, run in this process or on Spark: damage
planted in a compacted archive gets the same report from both, check for check and message
for message."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import compactor.verify.records as verify_records
from compactor import execution
from compactor.execution import InProcess
from compactor.job import CompactConfig, compact
from compactor.sources import open_source
from compactor.verify import CHECKS, MAX_REPORTED, plan_audit, verify
from compactor.verify.file import FileChecker
from compactor.verify.records import Read
from compactor.verify.spark import verify_spark
from keyfill.synth.generate import GeneratorConfig, generate
from keygroups import compacted
from keygroups.storage import open_storage
from tests.records import copy_archive, read_pieces, rewrite_group


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    """A small source and its archive, compacted in this process: several slices, groups and
    partitions, null keys."""
    root = tmp_path_factory.mktemp("audit")
    src, dest = str(root / "src"), str(root / "c")
    generate(
        GeneratorConfig(
            out=src,
            records=5_000,
            keys=60,
            partitions=4,
            chunk_records=700,
            jitter_ms=3_000,
            null_keys=0.03,
            rate=20.0,
            seed=3,
        ),
        progress=False,
    )
    compact(CompactConfig(source=src, dest=dest, groups=3, slice_duration="1m", seal_all=True))
    return src, dest


def one(batch: pa.RecordBatch, i: int) -> pa.RecordBatch:
    return batch.slice(i, 1)


def joined(*parts: pa.RecordBatch) -> pa.RecordBatch:
    return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]


def record(batch: pa.RecordBatch, i: int) -> str:
    """How the audit names record i of `batch`."""
    return f"partition {batch['partition'][i].as_py()} offset {batch['offset'][i].as_py()}"


def largest_piece(store) -> tuple[int, int, pa.RecordBatch]:
    meta, piece, batch = max(read_pieces(store), key=lambda x: x[1].records)
    return meta.slice, piece.group, batch


def changing(store, group: int, batches: dict[int, pa.RecordBatch]) -> None:
    """The group's pieces of these slices replaced by these records (its file and index rows
    rewritten to match)."""
    rewrite_group(store, group, lambda s, b: batches.get(s, b))


def lose_one(store) -> str:
    """The first record of the largest piece, gone from its file and from the index."""
    s, g, batch = largest_piece(store)
    changing(store, g, {s: batch.slice(1)})
    return f"{record(batch, 0)}: in the source, not in the archive"


def lose_many(store) -> str:
    """30 records of a piece from several partitions: more than a check lists (its first 20)."""
    s, g, batch = largest_piece(store)
    assert len(set(batch["partition"].to_pylist()[:30])) > 1
    changing(store, g, {s: batch.slice(30)})
    return "in the source, not in the archive"


def swap_across_slices(store) -> str:
    """A key's record in an earlier slice and its record in a later slice trade places (the
    same group, so the same file): each sits in the other's slice."""
    pieces = {(m.slice, p.group): b for m, p, b in read_pieces(store)}
    for (s, g), b in sorted(pieces.items()):
        later = [(t, c) for (t, h), c in sorted(pieces.items()) if h == g and t > s]
        for key in sorted({k for k in b["key"].to_pylist() if k is not None}):
            for t, c in later:
                if key in c["key"].to_pylist():
                    i, j = b["key"].to_pylist().index(key), c["key"].to_pylist().index(key)
                    changing(
                        store,
                        g,
                        {
                            s: joined(b.slice(0, i), one(c, j), b.slice(i + 1)),
                            t: joined(c.slice(0, j), one(b, i), c.slice(j + 1)),
                        },
                    )
                    return f"key {key!r}"
    raise AssertionError("no key with records in two slices of one group")


def swap_in_a_piece(store) -> str:
    """Two records of one key trade places inside a piece: only the key's order shows it."""
    s, g, batch = largest_piece(store)
    keys = batch["key"].to_pylist()
    key = next(k for k in keys if k is not None and keys.count(k) >= 2)
    i, j = [n for n, k in enumerate(keys) if k == key][:2]
    order = list(range(batch.num_rows))
    order[i], order[j] = j, i
    changing(store, g, {s: batch.take(pa.array(order))})
    return f"key {key!r} (partition {batch['partition'][i].as_py()}): offset {batch['offset'][i].as_py()} follows"


def move_into_an_earlier_slice(store) -> str:
    """The first record of a group's second piece moved to the end of its first: in a slice
    before the one its partition's running maximum names."""
    pieces = [(m.slice, p.group, b) for m, p, b in read_pieces(store)]
    g = pieces[0][1]
    (s, _, first), (t, _, second) = [x for x in pieces if x[1] == g][:2]
    changing(store, g, {s: joined(first, one(second, 0)), t: second.slice(1)})
    return f"{record(second, 0)}: in the slice starting at "


def repeat_one(store) -> str:
    """The last record of the largest piece written twice."""
    s, g, batch = largest_piece(store)
    last = batch.num_rows - 1
    changing(store, g, {s: joined(batch, one(batch, last))})
    return f"{record(batch, last)}: 2 times in the archive"


def change_one(store) -> str:
    """A record's value changed (its file's checksums made to match): only the fingerprints
    notice."""
    s, g, batch = largest_piece(store)
    values = batch["value"].to_pylist()
    values[5] = b"changed"
    at = batch.schema.get_field_index("value")
    changing(store, g, {s: batch.set_column(at, "value", pa.array(values, batch["value"].type))})
    return f"{record(batch, 5)}: record contents differ from the source"


DAMAGE = {
    "lost record": (lose_one, {"exactly_once", "manifest"}),
    "lost records": (lose_many, {"exactly_once", "manifest"}),
    "reordered key": (swap_across_slices, {"key_order", "slice_bounds"}),
    "reordered in a piece": (swap_in_a_piece, {"key_order"}),
    "outside its slice": (move_into_an_earlier_slice, {"slice_bounds", "manifest"}),
    "repeated record": (repeat_one, {"exactly_once", "key_order", "manifest"}),
    "changed record": (change_one, {"exactly_once"}),
}


@pytest.fixture
def tasks_apart(spark):
    """Spark's scan in as many tasks as shuffle partitions (4): adaptive execution would
    coalesce a small archive's into one, and the report must not depend on how partitions
    share tasks."""
    key = "spark.sql.adaptive.coalescePartitions.enabled"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "false")
    yield spark
    if before is None:
        spark.conf.unset(key)
    else:
        spark.conf.set(key, before)


@pytest.mark.parametrize("damage", DAMAGE)
def test_planted_damage_gets_the_same_report_in_process_and_on_spark(
    tasks_apart, archive, tmp_path, damage, monkeypatch
):
    src, dest = archive
    store = copy_archive(dest, str(tmp_path / "c"))
    plant, failing = DAMAGE[damage]
    named = plant(store)

    in_process = verify(open_source(src), store).to_json()
    on_spark = verify_spark(open_source(src), store, tasks_apart).to_json()
    assert on_spark == in_process
    assert {c for c in CHECKS if in_process["counts"][c]} == failing, in_process
    assert not in_process["ok"] and in_process["records"] == compacted.load_manifest(store).totals.records - (
        {"lost record": 1, "lost records": 30, "repeated record": -1}.get(damage, 0)
    )
    assert any(named in m for c in failing for m in in_process["violations"][c]), in_process
    # the comparison carries an offset's rows over batches of any size: the same report
    monkeypatch.setattr(execution, "SCAN_BATCH_ROWS", 97)
    assert verify(open_source(src), store, threads=1).to_json() == in_process


def test_a_sound_archive_gets_the_same_report_in_process_and_on_spark(tasks_apart, archive):
    src, dest = archive
    in_process = verify(open_source(src), open_storage(dest)).to_json()
    assert in_process["ok"] and in_process["records"] == 5_000, in_process
    assert verify_spark(open_source(src), open_storage(dest), tasks_apart).to_json() == in_process


def test_the_findings_are_the_same_however_tasks_share_the_partitions(archive, tmp_path):
    """The comparison as one task, or as a task per partition whose rows come back in any
    order (Spark's shuffle partitions, hashed), finds the same: each check's first violations
    in partition and offset order, their count, the hand-offs and totals."""
    src, dest = archive
    store = copy_archive(dest, str(tmp_path / "c"))
    lose_many(store)
    source = open_source(src)
    _, plan = plan_audit(source, store)
    assert plan is not None
    here = InProcess()
    read = verify_records.read_task(source, plan.chunks, FileChecker(store, plan.manifest), plan.files, plan.ranges)
    rows = here.map(verify_records.inputs(len(plan.chunks), len(plan.files)), read, verify_records.READ_ROWS)
    records = here.where(rows, "kind", [Read.SOURCE, Read.ARCHIVED], verify_records.RECORD_COLUMNS)

    def compared(rows: pa.Table) -> pa.Table:
        task = verify_records.compare_task(plan.manifest)
        return here.scan("records", rows, "partition", verify_records.SCAN_ORDER, task, verify_records.FOUND_ROWS)

    whole = verify_records.found(compared(records))
    partitions = sorted(set(records["partition"].to_pylist()), reverse=True)
    tasks = [compared(records.filter(pc.equal(records["partition"], p))) for p in partitions]
    assert verify_records.found(pa.concat_tables(tasks)) == whole
    assert whole.counts == {"exactly_once": 30} and len(whole.violations["exactly_once"]) == MAX_REPORTED
    assert sorted(whole.handoffs) == partitions[::-1] and whole.records == 5_000 - 30
