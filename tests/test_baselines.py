"""The benchmark's baseline replays (bench/baselines.py) yield exactly the source records,
each once, with every key's records in source offset order; otherwise the benchmark would
compare against something that does not do the same work."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from bench.baselines import BaselineError, PerPartitionReplay, ShardedReplay
from compactor.sources.envelope import build_index, read_chunk
from keyfill.synth.generate import GeneratorConfig, generate
from keygroups.storage import open_storage


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, pa.Table, int]:
    """A small archive with null keys, headers, a hot key and several chunks per partition."""
    url = str(tmp_path_factory.mktemp("baselines") / "src")
    generate(
        GeneratorConfig(
            out=url,
            records=12_000,
            keys=200,
            partitions=3,
            chunk_records=1_500,
            headers=True,
            null_keys=0.05,
            hot_key_share=0.3,
            jitter_ms=3_000,
            seed=4,
        ),
        progress=False,
    )
    store = open_storage(url)
    index = build_index(store)
    table = pa.Table.from_batches([read_chunk(store, c) for c in index.all_chunks()])
    return url, table, index.bytes


def check_same_records(out: pa.Table, src: pa.Table) -> None:
    """Same multiset of records (all columns), each (partition, offset) once."""
    assert out.num_rows == src.num_rows
    order = [("partition", "ascending"), ("offset", "ascending")]
    a, b = out.sort_by(order), src.sort_by(order)
    assert a.equals(b)
    pairs = np.stack([a.column("partition").to_numpy(), a.column("offset").to_numpy()], axis=1)
    assert len(np.unique(pairs, axis=0)) == a.num_rows


def check_key_order(out: pa.Table) -> None:
    """Every key's records (null keys: per partition) come out in strictly rising offsets."""
    last: dict[tuple[int, bytes | None], int] = {}
    for p, o, k in zip(
        out.column("partition").to_pylist(), out.column("offset").to_pylist(), out.column("key").to_pylist()
    ):
        kk = (p if k is None else -1, k)
        assert last.get(kk, -1) < o, f"key {k!r}: offset {o} after {last[kk]}"
        last[kk] = o


@pytest.mark.parametrize("read_ahead", [0, 2])
def test_per_partition(source: tuple[str, pa.Table, int], read_ahead: int) -> None:
    url, src, size = source
    with PerPartitionReplay(url, batch_size=700, read_ahead=read_ahead) as replay:
        out = pa.Table.from_batches(list(replay))
        assert replay.readers == 3
        assert replay.bytes_read == size
        assert replay.records == src.num_rows
    check_same_records(out, src)
    check_key_order(out)


@pytest.mark.parametrize("shards", [1, 4])
def test_sharded(source: tuple[str, pa.Table, int], shards: int) -> None:
    url, src, size = source
    with ShardedReplay(url, shards=shards, batch_size=500) as replay:
        out = pa.Table.from_batches(list(replay))
        assert replay.readers == shards
        assert replay.bytes_read == shards * size  # every shard reads the whole archive
    check_same_records(out, src)
    check_key_order(out)


def test_leaving_early_stops_readers(source: tuple[str, pa.Table, int]) -> None:
    url, _, _ = source
    with ShardedReplay(url, shards=3, batch_size=100, queue_batches=2) as replay:
        next(iter(replay))
    assert all(not w.is_alive() for w in replay._workers)


def test_failure_names_the_file(source: tuple[str, pa.Table, int], tmp_path) -> None:
    url, _, _ = source
    store = open_storage(url)
    index = build_index(store)
    bad = open_storage(str(tmp_path / "bad"))
    for c in index.all_chunks():
        bad.write(c.key, store.read(c.key))
    victim = index.all_chunks()[2]
    bad.write(victim.key, store.read(victim.key)[:2_000])  # header intact, data cut
    with pytest.raises(BaselineError, match=victim.key.split("/")[-1]), PerPartitionReplay(bad.url, index=index) as r:
        list(r)
