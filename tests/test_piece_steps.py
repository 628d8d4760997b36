"""A piece larger than a few decode steps is decoded a run of its blocks at a time, and one
larger than a quarter of the read-ahead is never held whole (docs/options.md, "What
read-ahead bounds"): checked whole before any of its records is decoded, the replay and a
Spark task's read hold at most the budget plus one step, every record comes once, in order,
also across checkpoints taken inside the piece; bytes that change between the check and the
decode are refused, naming the piece."""

from __future__ import annotations

import os
import time

import google_crc32c
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reader
import reader.fetch
import reader.fetched_span
import reader.spark
import reader.spark.enumerator
import reader.spark.split_reader
from compactor.job import CompactConfig, compact
from keyfill.synth.generate import GeneratorConfig, generate
from keygroups import compacted
from keygroups.envelope import framing
from keygroups.errors import IntegrityError
from keygroups.piece_steps import StepScan, decode_step
from keygroups.storage import open_storage
from reader.fetched_span import DECODE_BYTES, StreamedPiece
from reader.read_budget import FIRST_RATIO
from tests.records import archive_metas, copy_archive, spark_task_read

BLOCK = 64 << 10  # the archive's Avro blocks: many to a step
STREAMED = 4 << 20  # a read-ahead a quarter of which the hot piece exceeds: read twice
HELD = 48 << 20  # one it fits in: held, decoded in steps


@pytest.fixture(scope="module")
def hot(tmp_path_factory):
    """An archive of 1 h slices over 8 groups, one key carrying 60% of the records: its piece
    is ~9 MB compressed, ~25x a decode step decoded. With the records of every group from a
    plain replay (in order), the hot piece and its file's header and bytes."""
    root = tmp_path_factory.mktemp("hot")
    src, dest = str(root / "src"), str(root / "c")
    generate(
        GeneratorConfig(
            out=src,
            records=300_000,
            keys=2_000,
            partitions=3,
            chunk_records=50_000,
            headers=True,
            rate=100.0,
            seed=5,
            hot_key_share=0.6,
        ),
        progress=False,
    )
    compact(CompactConfig(source=src, dest=dest, groups=8, slice_duration="1h", seal_all=True, block_bytes=BLOCK))
    store = open_storage(dest)
    piece = max((p for m in archive_metas(store) for p in m.pieces), key=lambda p: p.length)
    header = store.read_range(piece.file, 0, piece.file_header)
    data = store.read_range(piece.file, piece.offset, piece.length)
    whole = compacted.read_piece(header, data, piece, piece.file)
    assert piece.length > 2 * (STREAMED // 4) and whole.nbytes > 20 * DECODE_BYTES
    return dest, _by_group(dest), piece, header, data, whole


def _by_group(url: str, **options) -> dict[int, list[tuple[int, int]]]:
    got: dict[int, list[tuple[int, int]]] = {}
    with reader.replay(url, threads=1, **options) as events:
        for ev in events:
            if isinstance(ev, reader.Records):
                got.setdefault(ev.group, []).extend(_ids(ev.batch))
    return got


def _ids(batch: pa.RecordBatch) -> list[tuple[int, int]]:
    return list(zip(batch.column("partition").to_pylist(), batch.column("offset").to_pylist()))


def _block_starts(header: bytes, data: bytes, offset: int) -> set[int]:
    _, sync, _ = framing.read_header(header, "h")
    buf = np.frombuffer(data, np.uint8)
    _, ends, _, err, _ = framing.frame_blocks(buf, 0, np.frombuffer(sync, np.uint8))
    assert not err
    return {offset, *(offset + int(e) + 16 for e in ends)}


def _walk(piece, data: bytes, cuts: list[int], step_bytes: int):
    walk = StepScan(piece, "hot.avro", step_bytes)
    at = 0
    for c in [*sorted(set(cuts)), len(data)]:
        if c > at:
            walk.feed(data[at:c])
            at = c
    return walk.steps()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cuts=st.lists(st.integers(0, 1 << 24), max_size=40),
    step_bytes=st.integers(1, 4 << 20),
)
def test_a_piece_fed_in_any_pieces_is_cut_at_its_own_blocks(hot, cuts, step_bytes):
    """Wherever the bytes arrive cut (a GET's end, a header split in two), the steps begin
    at block starts, each but the last of at least step_bytes, their records and CRC-32Cs
    those of their bytes: what the second read checks against."""
    _, _, piece, header, data, _ = hot
    cuts = [c % (len(data) + 1) for c in cuts]
    steps = _walk(piece, data, cuts, step_bytes)
    starts = _block_starts(header, data, piece.offset)
    assert steps.cuts[0] == piece.offset and steps.cuts[-1] == piece.end
    assert set(steps.cuts[:-1].tolist()) <= starts
    lengths = np.diff(steps.cuts)
    assert (lengths[:-1] >= step_bytes).all() and (lengths > 0).all()
    assert int(steps.records.sum()) == piece.records
    for k in range(len(steps)):
        a, b = steps.bounds(k)
        assert int(steps.crc[k]) == google_crc32c.value(data[a - piece.offset : b - piece.offset])


def test_the_steps_decode_to_the_piece(hot):
    """Decoded step after step, a piece's records are its records decoded whole."""
    _, _, piece, header, data, whole = hot
    steps = _walk(piece, data, [5, 1 << 20, (3 << 20) + 7], DECODE_BYTES)
    assert len(steps) > 4
    parts = []
    for k in range(len(steps)):
        a, b = steps.bounds(k)
        parts.append(decode_step(header, data[a - piece.offset : b - piece.offset], steps, k, "hot", fetched=True))
    assert pa.Table.from_batches(parts).equals(pa.Table.from_batches([whole]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(at=st.integers(0, 1 << 30), bit=st.integers(0, 7))
def test_a_flipped_bit_anywhere_is_named_before_any_step(hot, at, bit):
    _, _, piece, _, data, _ = hot
    damaged = bytearray(data)
    damaged[at % len(data)] ^= 1 << bit
    with pytest.raises(IntegrityError) as caught:
        _walk(piece, bytes(damaged), [1 << 20], DECODE_BYTES)
    assert piece.where("hot.avro") in str(caught.value)


def _step_bound(piece, whole: pa.RecordBatch) -> int:
    """The most one step holds: a decode step and a block of compressed bytes, reserved at
    FIRST_RATIO times them or charged as decoded, whichever is more."""
    return int(max(FIRST_RATIO, whole.nbytes / piece.length) * (DECODE_BYTES + BLOCK))


def _compressed(budget: int, piece) -> int:
    """The hot piece's compressed bytes a reader holds: two GETs of an eighth of the budget
    when it is streamed, else the piece."""
    return 2 * max(DECODE_BYTES, budget // 8) if piece.length > budget // 4 else piece.length


@pytest.mark.parametrize("budget", [pytest.param(STREAMED, marks=pytest.mark.stores), HELD], ids=["streamed", "held"])
def test_a_slow_consumer_of_a_hot_piece_holds_the_budget_and_a_step(hot, budget, request):
    """Four threads, a consumer that sleeps on every batch: every group's records once and in
    order, no step larger than a step, the most held within the budget and one piece past it
    while the consumer starves (its compressed bytes as held, and one step); streamed from S3
    (two GETs' bytes held, far below the hot piece decoded), held from local files."""
    src, expected, piece, _, _, whole = hot
    url = request.getfixturevalue("s3_url" if budget == STREAMED else "local_url")
    copy_archive(src, url)
    got: dict[int, list[tuple[int, int]]] = {}
    largest = 0
    with reader.replay(url, threads=4, read_ahead_bytes=budget, batch_size=2_000) as events:
        for ev in events:
            if isinstance(ev, reader.Records):
                got.setdefault(ev.group, []).extend(_ids(ev.batch))
                largest = max(largest, ev.batch.get_total_buffer_size())  # the step it is a slice of
                time.sleep(0.002)
        peak = events.budget.peak
        assert events.budget.held == 0
    assert got == expected
    step = _step_bound(piece, whole)
    assert largest <= step < whole.nbytes / 6
    assert peak <= budget + _compressed(budget, piece) + step
    if budget == STREAMED:
        assert budget + _compressed(budget, piece) + step < whole.nbytes / 2


def test_a_spark_task_reading_a_hot_piece_holds_the_budget_and_a_step(hot, monkeypatch):
    src, expected, piece, _, _, whole = hot
    batches, budgets = spark_task_read(src, STREAMED, monkeypatch)
    got: dict[int, list[tuple[int, int]]] = {}
    for batch in batches:
        for g, ids in zip(batch.column("key_group").to_pylist(), _ids(batch)):
            got.setdefault(g, []).append(ids)
        time.sleep(0.002)
    assert got == expected
    (budget,) = budgets
    assert budget.held == 0
    assert 0 < budget.peak <= STREAMED + _compressed(STREAMED, piece) + _step_bound(piece, whole) < whole.nbytes / 2


def test_checkpoints_inside_a_hot_piece_resume_exactly_once(hot):
    """Stopped every few batches, also inside the hot piece's steps, and resumed from the
    checkpoint each time: every record once, each group's in order."""
    src, expected, _, _, _, _ = hot
    got: dict[int, list[tuple[int, int]]] = {}
    state, stops = None, 0
    while True:
        with reader.replay(src, threads=2, read_ahead_bytes=STREAMED, batch_size=5_000, resume=state) as events:
            n, finished = 0, True
            for ev in events:
                if isinstance(ev, reader.Records):
                    got.setdefault(ev.group, []).extend(_ids(ev.batch))
                    n += 1
                    if n == 7:
                        finished = False
                        break
            state = events.checkpoint()
        if finished:
            break
        stops += 1
    assert stops > 8
    assert got == expected


def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))


def test_a_hot_piece_changed_between_its_check_and_its_decode_is_refused(hot, local_url, monkeypatch):
    """The object is rewritten after the first read checked it: the second read's step is
    refused naming the piece; what came before it was the checked bytes, and a replay resumed
    from its checkpoint once the object is whole again is exactly once."""
    src, expected, piece, _, _, _ = hot
    copy_archive(src, local_url)
    path = os.path.join(local_url, piece.file)
    late = piece.offset + piece.length * 3 // 4
    original = StreamedPiece.scan

    def changed_after(self, p, url):
        steps = original(self, p, url)
        _flip(path, late)
        return steps

    monkeypatch.setattr(StreamedPiece, "scan", changed_after)
    got: dict[int, list[tuple[int, int]]] = {}
    with pytest.raises(reader.ReplayError, match="differ from what was checked") as caught:
        with reader.replay(local_url, threads=1, read_ahead_bytes=STREAMED, batch_size=1_000) as events:
            for ev in events:
                if isinstance(ev, reader.Records):
                    got.setdefault(ev.group, []).extend(_ids(ev.batch))
                    state = events.checkpoint()
    assert f"bytes {piece.offset}..{piece.end}" in str(caught.value)
    assert 0 < len(got.get(piece.group, [])) < piece.records
    monkeypatch.undo()
    _flip(path, late)  # whole again
    with reader.replay(local_url, threads=1, read_ahead_bytes=STREAMED, resume=state) as events:
        for ev in events:
            if isinstance(ev, reader.Records):
                got.setdefault(ev.group, []).extend(_ids(ev.batch))
    assert got == expected


def test_a_damaged_hot_piece_emits_none_of_its_records(hot, local_url):
    src, _, piece, _, _, _ = hot
    copy_archive(src, local_url)
    _flip(os.path.join(local_url, piece.file), piece.end - 100)
    emitted = 0
    with pytest.raises(reader.ReplayError, match="CRC-32C differs") as caught:
        with reader.replay(local_url, threads=1, read_ahead_bytes=STREAMED) as events:
            for ev in events:
                if isinstance(ev, reader.Records) and (ev.group, ev.slice) == (piece.group, piece.slice):
                    emitted += ev.batch.num_rows
    assert f"bytes {piece.offset}..{piece.end}" in str(caught.value)
    assert emitted == 0


def test_a_drift_bound_reads_a_hot_piece_whole_in_its_steps(hot):
    """Under a drift bound a thread merges its groups' pieces of a slice by event time, so it
    takes the hot piece's steps together (the bound's documented exception): the same records."""
    src, expected, _, _, _, _ = hot
    assert _by_group(src, read_ahead_bytes=STREAMED, max_drift_ms=60_000) == expected
