"""The synthetic archive generator: determinism and the distributions it promises."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactor.sources.envelope import build_index, read_chunk
from keyfill.synth.generate import GeneratorConfig, generate, key_probabilities, user_key
from keyfill.synth.kafka_partitioner import kafka_partition
from keygroups.envelope import record_bytes
from keygroups.storage import open_storage


def load(url: str) -> pa.Table:
    store = open_storage(url)
    index = build_index(store)
    return pa.Table.from_batches([read_chunk(store, c) for c in index.all_chunks()])


def files(url: str) -> dict[str, bytes]:
    store = open_storage(url)
    return {o.key: store.read(o.key) for o in store.list()}


def test_same_seed_same_bytes_on_both_backends(storage_url, tmp_path):
    cfg = dict(records=30_000, keys=500, partitions=3, chunk_records=4_000, headers=True, seed=11)
    generate(GeneratorConfig(out=storage_url, **cfg), progress=False)
    generate(GeneratorConfig(out=str(tmp_path / "again"), **cfg), progress=False)
    a, b = files(storage_url), files(str(tmp_path / "again"))
    assert a and a == b
    generate(GeneratorConfig(out=str(tmp_path / "other"), **{**cfg, "seed": 12}), progress=False)
    assert files(str(tmp_path / "other")) != a


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    cfg = GeneratorConfig(
        out=str(tmp_path_factory.mktemp("gen")),
        records=200_000,
        keys=5_000,
        partitions=6,
        chunk_records=15_000,
        skew=1.1,
        jitter_ms=3_000,
        null_keys=0.05,
        headers=True,
        seed=3,
    )
    generate(cfg, progress=False)
    return cfg, load(cfg.out)


def test_chunking_offsets_and_counts(archive):
    cfg, t = archive
    index = build_index(open_storage(cfg.out))
    assert index.records == cfg.records == t.num_rows
    assert not index.gaps
    for p in index.partitions():
        chunks = index.partition_chunks(p)
        assert chunks[0].first_offset == 0
        assert all(c.records == cfg.chunk_records for c in chunks[:-1])
        assert 1 <= chunks[-1].records <= cfg.chunk_records


def test_keys_sit_where_kafkas_partitioner_puts_them(archive):
    cfg, t = archive
    keyed = t.filter(pc.is_valid(t.column("key")))
    pairs = set(zip(keyed.column("key").to_pylist(), keyed.column("partition").to_pylist()))
    assert len({k for k, _ in pairs}) == len(pairs)  # one partition per key
    for key, partition in pairs:
        assert partition == kafka_partition(key, cfg.partitions)


def test_event_time_jitter_is_bounded_per_partition(archive):
    cfg, t = archive
    late_seen = 0
    for p in range(cfg.partitions):
        part = t.filter(pc.equal(t.column("partition"), p))
        offsets = part.column("offset").to_numpy()
        ts = part.column("timestamp").cast(pa.int64()).to_numpy()[np.argsort(offsets)]
        lateness = np.maximum.accumulate(ts) - ts
        assert lateness.max() <= cfg.jitter_ms
        late_seen += int((lateness > 0).sum())
    assert late_seen > 0.2 * cfg.records  # out of order for real, not just sorted


def test_null_key_fraction(archive):
    cfg, t = archive
    share = t.column("key").null_count / t.num_rows
    assert abs(share - cfg.null_keys) < 4 * np.sqrt(cfg.null_keys * (1 - cfg.null_keys) / t.num_rows)


def test_top_keys_hold_their_zipf_share_of_bytes(archive):
    cfg, t = archive
    keyed = t.filter(pc.is_valid(t.column("key")))
    volume = pa.table({"key": keyed.column("key"), "b": record_bytes(keyed.combine_chunks().to_batches()[0])})
    per_key = volume.group_by("key").aggregate([("b", "sum")])
    by_key = dict(zip(per_key.column("key").to_pylist(), per_key.column("b_sum").to_numpy()))
    total = sum(by_key.values())
    p = key_probabilities(cfg)
    for rank in (0, 1, 9):
        got = by_key[user_key(rank, cfg.keys)] / total
        assert abs(got - p[rank]) < 0.1 * p[rank], (rank, got, p[rank])
    top10 = sum(by_key.get(user_key(i, cfg.keys), 0) for i in range(10)) / total
    assert abs(top10 - p[:10].sum()) < 0.03


def test_values_are_json_payments(archive):
    import json

    _, t = archive
    for key, value in zip(t.column("key").to_pylist()[:2000], t.column("value").to_pylist()[:2000]):
        doc = json.loads(value)
        assert set(doc) == {"user", "amount", "merchant", "currency", "ts"}
        assert doc["user"] == (None if key is None else key.decode())
        assert doc["currency"] in {"EUR", "USD", "GBP", "CHF"} and doc["amount"] > 0


def test_headers_when_asked(archive):
    _, t = archive
    headers = t.column("headers").to_pylist()
    assert all(h and h[0]["key"] == "trace-id" and len(h[0]["value"]) == 16 for h in headers)
    assert any(len(h) == 2 and h[1]["value"] is None for h in headers)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(share=st.floats(0.3, 0.95), keys=st.integers(2, 300))
def test_hot_key_gets_its_share(tmp_path_factory, share, keys):
    out = tmp_path_factory.mktemp("hot")
    cfg = GeneratorConfig(
        out=str(out), records=20_000, keys=keys, partitions=4, hot_key_share=share, null_keys=0.0, seed=keys
    )
    generate(cfg, progress=False)
    t = load(cfg.out)
    hot = pc.sum(pc.equal(t.column("key"), user_key(0, keys))).as_py() / t.num_rows
    assert abs(hot - share) < 4 * np.sqrt(share * (1 - share) / t.num_rows) + 1e-9


def test_refuses_a_non_empty_destination_unless_overwrite(tmp_path):
    cfg = GeneratorConfig(out=str(tmp_path), records=100, keys=10)
    generate(cfg, progress=False)
    with pytest.raises(Exception, match="not empty"):
        generate(cfg, progress=False)
    generate(GeneratorConfig(out=str(tmp_path), records=50, keys=10, overwrite=True), progress=False)
    assert build_index(open_storage(str(tmp_path))).records == 50


def test_failure_midway_leaves_nothing_behind(tmp_path, monkeypatch):
    from keygroups.storage import LocalStorage

    calls = {"n": 0}
    real = LocalStorage.write

    def flaky(self, key, data):
        calls["n"] += 1
        if calls["n"] == 4:
            raise OSError("disk full (injected)")
        return real(self, key, data)

    monkeypatch.setattr(LocalStorage, "write", flaky)
    with pytest.raises(OSError, match="injected"):
        generate(
            GeneratorConfig(out=str(tmp_path), records=20_000, keys=50, chunk_records=1_000, threads=2), progress=False
        )
    monkeypatch.undo()
    assert open_storage(str(tmp_path)).list() == []


@pytest.mark.parametrize(
    "bad",
    [dict(partitions=0), dict(null_keys=1.5), dict(codec="lz4"), dict(hot_key_share=1.0), dict(topic="a/b")],
)
def test_bad_options_are_named(tmp_path, bad):
    with pytest.raises(ValueError, match="--"):
        GeneratorConfig(out=str(tmp_path), **bad)


def test_logins_go_with_the_payments_without_changing_them(tmp_path):
    """--logins: about one payment in ten gets a login by its user 1-30 s before it, on the same
    partition, from --logins-after on; the payments are the bytes they are without logins."""
    cfg = dict(records=30_000, keys=200, partitions=3, chunk_records=5_000, rate=500.0, seed=4)
    alone, with_logins, logins = (str(tmp_path / n) for n in ("alone", "with", "logins"))
    generate(GeneratorConfig(out=alone, **cfg), progress=False)
    result = generate(
        GeneratorConfig(out=with_logins, logins_out=logins, logins_after_ms=20_000, **cfg), progress=False
    )
    assert files(alone) == files(with_logins)
    pay, log = load(with_logins), load(logins)
    assert result.logins == log.num_rows and 0.07 < log.num_rows / pay.num_rows * (60 / 40) < 0.13
    start = pc.min(pay.column("timestamp").cast(pa.int64())).as_py()
    paid = {}
    for key, p, ts in zip(
        pay.column("key").to_pylist(),
        pay.column("partition").to_pylist(),
        pay.column("timestamp").cast(pa.int64()).to_pylist(),
    ):
        paid.setdefault((key, p), []).append(ts)
    for key, p, ts in zip(
        log.column("key").to_pylist(),
        log.column("partition").to_pylist(),
        log.column("timestamp").cast(pa.int64()).to_pylist(),
    ):
        times = np.array(paid[(key, p)])  # the user pays on this partition
        assert ((times - ts >= 1_000) & (times - ts <= 30_000)).any()  # ... 1-30 s after this login
        assert ts >= start + 20_000 - 30_000
    for part in range(3):  # each partition's logins in offset order are in event-time order within a block
        rows = log.filter(pc.equal(log.column("partition"), part))
        assert rows.column("offset").to_pylist() == list(range(rows.num_rows))
        assert rows.column("timestamp").cast(pa.int64()).to_pylist() == sorted(
            rows.column("timestamp").cast(pa.int64()).to_pylist()
        )
