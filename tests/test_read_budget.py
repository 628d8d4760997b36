"""The read-ahead budget bounds what a reader holds whatever its consumer's pace
(docs/options.md, "read-ahead"): bytes fetched and not yet decoded plus decoded records not
yet handed over stay within `read_ahead_bytes`, or one piece past it, in the replay and in a
Spark task's read, on slices far larger than the budget. Counted in the reader
(`ReadBudget.peak`), against a bound the test computes from the archive's pieces."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

import reader
import reader.fetch
import reader.spark
import reader.spark.enumerator
import reader.spark.split_reader
from compactor.job import CompactConfig, compact
from keyfill.synth.generate import GeneratorConfig, generate
from keygroups.storage import open_storage
from reader.read_budget import FIRST_RATIO
from tests.records import archive_metas, copy_archive, spark_task_read

BUDGET = 256 << 10


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """An archive of 1 h slices (three), each ~40x the budget, over 128 groups: compacted in
    process, with the decoded bytes of each piece (group, slice) from a plain replay."""
    root = tmp_path_factory.mktemp("budget")
    src = str(root / "src")
    generate(
        GeneratorConfig(
            out=src,
            records=150_000,
            keys=5_000,
            partitions=3,
            chunk_records=25_000,
            headers=True,
            rate=20.0,
            seed=3,
            skew=0.2,
        ),
        progress=False,
    )
    dest = str(root / "c")
    compact(CompactConfig(source=src, dest=dest, groups=128, slice_duration="1h", seal_all=True))
    decoded: dict[tuple[int, int], int] = {}
    records: list[tuple[int, int]] = []
    with reader.replay(dest, threads=1) as events:
        for ev in events:
            if isinstance(ev, reader.Records):
                # what the budget charges: the whole decoded step the batch is a slice of
                # (its buffers as allocated), not the slice's share of them
                key = (ev.group, ev.slice)
                decoded[key] = max(decoded.get(key, 0), ev.batch.get_total_buffer_size())
                records.extend(_ids(ev.batch))
    return dest, decoded, sorted(records)


def _ids(batch: pa.RecordBatch) -> list[tuple[int, int]]:
    return list(zip(batch.column("partition").to_pylist(), batch.column("offset").to_pylist()))


def _bound(url: str, decoded: dict[tuple[int, int], int]) -> tuple[int, int]:
    """The budget's bound: read_ahead_bytes plus one piece, its compressed bytes and its
    records as reserved before decoding (FIRST_RATIO x its bytes) or as decoded, whichever is
    more; and the bytes of the largest slice, which the bound must be far below."""
    metas = archive_metas(open_storage(url))
    largest = max(p.length for m in metas for p in m.pieces)
    piece = largest + max(int(FIRST_RATIO * largest), max(decoded.values()))
    widest = max(sum(p.length for p in m.pieces) for m in metas)
    return BUDGET + piece, widest


def test_a_slow_consumer_holds_a_replay_within_its_budget(wide, storage_url):
    """Four threads, a consumer that sleeps on every batch: the threads wait for it instead of
    fetching and decoding whole slices ahead, and every record still comes once."""
    src, decoded, expected = wide
    url = storage_url
    copy_archive(src, url)
    bound, widest = _bound(url, decoded)
    assert widest > 8 * bound  # slices far larger than what may be held
    got = []
    with reader.replay(url, threads=4, read_ahead_bytes=BUDGET, batch_size=500) as events:
        for ev in events:
            if isinstance(ev, reader.Records):
                got.extend(_ids(ev.batch))
                time.sleep(0.004)
        peak = events.budget.peak
        assert events.budget.held == 0  # everything charged was given back
    assert sorted(got) == expected
    assert 0 < peak <= bound


def test_a_slow_consumer_holds_a_spark_task_read_within_its_budget(wide, storage_url, monkeypatch):
    """The Spark source's task read (`spark_read.read_archive`, one partition of every group) with
    a consumer that sleeps on every batch, as a slow stateful query pulls."""
    src, decoded, expected = wide
    url = storage_url
    copy_archive(src, url)
    bound, _ = _bound(url, decoded)
    batches, budgets = spark_task_read(url, BUDGET, monkeypatch)
    got = []
    for batch in batches:
        got.extend(_ids(batch))
        time.sleep(0.002)
    assert sorted(got) == expected
    (budget,) = budgets
    assert budget.held == 0
    assert 0 < budget.peak <= bound
