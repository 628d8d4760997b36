"""A realistic synthetic source archive: a payments topic as a Kafka producer fleet would
have written it, for examples, tests and benchmarks.

Keys are users whose record volume follows a Zipf law (optionally one hot key holding a
given share), placed on partitions by Kafka's default partitioner; event timestamps rise
with bounded out-of-order jitter; a fraction of records has no key.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from compactor.sources.envelope import encode_chunk
from keyfill.synth.formatting import CURRENCIES, CURRENCY_BYTES, HEX_DIGITS, fill_headers, payment_json
from keyfill.synth.kafka_partitioner import kafka_partitions
from keygroups.envelope import ARROW_SCHEMA, CODECS, HEADER_TYPE
from keygroups.envelope.buffers import arrow_binary
from keygroups.errors import OptionError
from keygroups.storage import Storage, StorageError, open_storage

DEFAULT_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
_STEP_RECORDS = 1 << 18  # records drawn per step; fixed so output never depends on machine or threads
LOGINS_TOPIC = "logins"


@dataclass(frozen=True)
class GeneratorConfig:
    out: str
    topic: str = "payments"
    partitions: int = 8
    keys: int = 10_000
    records: int = 1_000_000
    chunk_records: int = 100_000
    skew: float = 1.1
    seed: int = 0
    jitter_ms: int = 2_000
    null_keys: float = 0.01
    headers: bool = False
    hot_key_share: float | None = None
    rate: float = 1_000.0  # records per second of event time
    start_ms: int = DEFAULT_START_MS
    codec: str = "snappy"
    threads: int = 8
    overwrite: bool = False
    logins_out: str | None = None  # also write the logins topic that goes with the payments here
    logins_after_ms: int = 0  # the logins start this long after the payments

    def __post_init__(self) -> None:
        checks = [
            (1 <= self.partitions <= 100_000, "--partitions must be in 1..100000"),
            (1 <= self.keys <= 2**31 - 1, "--keys must be in 1..2147483647"),
            (0 <= self.records <= 10**12, "--records must be in 0..10**12"),
            (0 <= self.seed < 2**63, "--seed must be in 0..2**63-1"),
            (self.chunk_records <= 2**31 - 1, "--chunk-records must be at most 2147483647"),
            (self.jitter_ms <= 10**12, "--jitter-ms must be at most 10**12"),
            (self.rate <= 10**9, "--rate must be at most 10**9 records/s"),
            (self.chunk_records >= 1, "--chunk-records must be at least 1"),
            (self.skew >= 0, "--skew must not be negative"),
            (self.jitter_ms >= 0, "--jitter-ms must not be negative"),
            (0 <= self.null_keys <= 1, "--null-keys is a fraction in [0, 1]"),
            (self.rate > 0, "--rate must be positive"),
            (self.codec in CODECS, f"--codec must be one of {', '.join(CODECS)}"),
            (
                self.hot_key_share is None or 0 < self.hot_key_share < 1,
                "--hot-key-share is a fraction in (0, 1)",
            ),
            (bool(self.topic) and "/" not in self.topic, "--topic must be a non-empty name without '/'"),
            (self.logins_after_ms >= 0, "--logins-after must not be negative"),
            (self.logins_out != self.out or self.logins_out is None, "--logins must be another root than --out"),
        ]
        for ok, message in checks:
            if not ok:
                raise OptionError(message)


@dataclass
class GenerateResult:
    url: str
    records: int = 0
    chunks: int = 0
    bytes: int = 0
    seconds: float = 0.0
    per_partition: dict[int, int] = field(default_factory=dict)
    logins: int = 0  # records of the logins topic, with `logins_out`


def user_key(i: int, keys: int = 10**8) -> bytes:
    """Key of user i; all keys of an archive have the same width."""
    return b"user-%0*d" % (max(8, len(str(keys - 1))), i)


def key_probabilities(cfg: GeneratorConfig) -> np.ndarray:
    """Share of records (and so of bytes) per key id: Zipf over ranks, key 0 heaviest."""
    ranks = np.arange(1, cfg.keys + 1, dtype=np.float64)
    p = ranks**-cfg.skew
    shares: np.ndarray  # numpy's stubs say Any of this arithmetic
    if cfg.hot_key_share is None:
        shares = p / p.sum()
    elif cfg.keys == 1:
        shares = np.ones(1)
    else:
        rest = p[1:] / p[1:].sum() * (1 - cfg.hot_key_share)
        shares = np.concatenate([[cfg.hot_key_share], rest])
    return shares


class _Draw:
    """Draws blocks of records in production order from one seeded generator."""

    def __init__(self, cfg: GeneratorConfig):
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.p = key_probabilities(cfg)
        self.cdf = np.cumsum(self.p)
        self.cdf[-1] = 1.0
        self.users = [user_key(i, cfg.keys) for i in range(cfg.keys)]
        self.key_matrix = np.frombuffer(b"".join(self.users), np.uint8).reshape(cfg.keys, -1)
        self.key_partition = kafka_partitions(self.users, cfg.partitions)
        self.next_offset = np.zeros(cfg.partitions, dtype=np.int64)
        self.produced = 0

    def draw(self, n: int) -> pa.RecordBatch:
        """The next n records, grouped by partition (rows bounds[p]:bounds[p+1] are p's)."""
        cfg, rng = self.cfg, self.rng
        key_id = np.searchsorted(self.cdf, rng.random(n), side="right").clip(0, cfg.keys - 1)
        null = rng.random(n) < cfg.null_keys
        partition = np.where(null, rng.integers(0, cfg.partitions, n), self.key_partition[key_id]).astype(np.int32)
        nominal = cfg.start_ms + ((self.produced + np.arange(n)) * 1000.0 / cfg.rate).astype(np.int64)
        ts = nominal - rng.integers(0, cfg.jitter_ms + 1, n)
        cents = rng.integers(100, 500_000, n)
        merchant = rng.integers(0, 5_000, n)
        currency = rng.integers(0, len(CURRENCIES), n)
        self.produced += n

        # Group by partition, keeping production order inside each; offsets continue each
        # partition's count.
        order = np.argsort(partition, kind="stable")
        key_id, null, partition, ts = key_id[order], null[order], partition[order], ts[order]
        cents, merchant, currency = cents[order], merchant[order], currency[order]
        counts = np.bincount(partition, minlength=cfg.partitions)
        starts = np.concatenate([[0], np.cumsum(counts)])
        offset = self.next_offset[partition] + np.arange(n) - starts[partition]
        self.next_offset += counts
        self.bounds = starts

        width = self.key_matrix.shape[1]
        key_bytes = self.key_matrix[key_id]  # (n, width) uint8
        values = payment_json(key_bytes, null, cents, merchant, currency, ts, CURRENCY_BYTES)
        keys = pa.Array.from_buffers(
            pa.binary(),
            n,
            [
                pa.array(~null).buffers()[1],
                pa.py_buffer(np.arange(n + 1, dtype=np.int32) * width),
                pa.py_buffer(key_bytes),
            ],
            null_count=int(null.sum()),
        )
        return pa.RecordBatch.from_arrays(
            [
                pa.array(partition),
                pa.array(offset),
                pa.array(ts, pa.timestamp("ms", tz="UTC")),
                keys,
                values,
                self._headers(n),
            ],
            schema=ARROW_SCHEMA,
        )

    def _headers(self, n: int) -> pa.Array:
        """No headers, or per record a trace id and (in 3 of 4 records) a source tag."""
        if not self.cfg.headers:
            return pa.ListArray.from_arrays(np.zeros(n + 1, np.int32), pa.array([], HEADER_TYPE))
        trace = self.rng.integers(0, 256, (n, 8), dtype=np.uint8)
        has_origin = self.rng.random(n) < 0.75
        origin_null = self.rng.random(n) < 0.5
        list_offsets = np.zeros(n + 1, np.int32)
        np.cumsum(1 + has_origin.astype(np.int32), out=list_offsets[1:])
        m = int(list_offsets[-1])
        key_off, key_data = np.empty(m + 1, np.int32), np.empty(8 * m, np.uint8)
        val_off, val_data = np.empty(m + 1, np.int32), np.empty(16 * m, np.uint8)
        val_valid = np.empty(m, np.bool_)
        fill_headers(trace, has_origin, origin_null, HEX_DIGITS, key_off, key_data, val_off, val_data, val_valid)
        items = pa.StructArray.from_arrays(
            [
                arrow_binary(len(key_off) - 1, key_off, key_data, None, pa.string()),
                arrow_binary(len(val_off) - 1, val_off, val_data, val_valid, pa.binary()),
            ],
            fields=list(HEADER_TYPE),
        )
        return pa.ListArray.from_arrays(list_offsets, items)


class _ChunkWriter:
    """One topic's chunk files: each partition's records cut into chunks of chunk_records,
    encoded and uploaded in a thread pool; on failure the chunks written are removed again."""

    def __init__(self, store: Storage, topic: str, cfg: GeneratorConfig, pool: ThreadPoolExecutor):
        self.store, self.topic, self.cfg, self.pool = store, topic, cfg, pool
        self.pending: dict[int, list[pa.RecordBatch]] = {p: [] for p in range(cfg.partitions)}
        self.pending_n = np.zeros(cfg.partitions, dtype=np.int64)
        self.written: list[str] = []
        self.in_flight: list[Future[None]] = []
        self.lock = threading.Lock()
        self.chunks = self.bytes = 0

    def add(self, batch: pa.RecordBatch, bounds: np.ndarray) -> None:
        """Records grouped by partition: rows bounds[p]:bounds[p+1] are partition p's."""
        for p in range(self.cfg.partitions):
            if bounds[p + 1] > bounds[p]:
                self.pending[p].append(batch.slice(bounds[p], bounds[p + 1] - bounds[p]))
                self.pending_n[p] += bounds[p + 1] - bounds[p]
                self._flush(p, final=False)

    def finish(self) -> None:
        for p in range(self.cfg.partitions):
            self._flush(p, final=True)
        self.wait()

    def wait(self) -> None:
        for f in self.in_flight:
            f.result()
        self.in_flight.clear()

    def remove(self) -> None:
        for key in self.written:
            try:
                self.store.delete(key)
            except Exception:
                pass

    def _write(self, piece: pa.RecordBatch) -> None:
        key, data = encode_chunk(piece, self.topic, codec=self.cfg.codec)
        with self.lock:
            self.written.append(key)
            self.chunks += 1
            self.bytes += len(data)
        self.store.write(key, data)

    def _flush(self, p: int, final: bool) -> None:
        if self.pending_n[p] == 0:
            return
        size = self.cfg.chunk_records
        table = pa.Table.from_batches(self.pending[p], schema=ARROW_SCHEMA).combine_chunks()
        cut = 0
        while table.num_rows - cut >= size or (final and cut < table.num_rows):
            piece = table.slice(cut, size).combine_chunks().to_batches()[0]
            # Encoding runs in the pool too: the encoder and snappy release the GIL.
            self.in_flight.append(self.pool.submit(self._write, piece))
            cut += piece.num_rows
        rest = table.slice(cut)
        self.pending[p] = rest.to_batches() if rest.num_rows else []
        self.pending_n[p] = rest.num_rows
        while len(self.in_flight) > 2 * self.cfg.threads:
            self.in_flight.pop(0).result()


class _Logins:
    """The logins topic that goes with the payments: for about one payment in ten (by a
    generator of its own, so the payments stay what they are without it), a login by the
    same user 1 to 30 s before it, on the same partition (Kafka's partitioner, same key),
    from `logins_after_ms` past the payments' start on. A producer writes logins as they
    happen, so each block's logins go out in event-time order."""

    SHARE = 0.1

    def __init__(self, cfg: GeneratorConfig):
        self.cfg = cfg
        self.rng = np.random.default_rng([cfg.seed, 1])
        self.next_offset = np.zeros(cfg.partitions, dtype=np.int64)
        self.records = 0

    def follow(self, payments: pa.RecordBatch) -> tuple[pa.RecordBatch, np.ndarray]:
        cfg, n = self.cfg, payments.num_rows
        ts = payments.column("timestamp").cast(pa.int64()).to_numpy()
        keys = payments.column("key")
        lead = self.rng.integers(1_000, 30_001, n)
        picked = self.rng.random(n) < self.SHARE
        picked &= keys.is_valid().to_numpy(zero_copy_only=False)
        picked &= ts >= cfg.start_ms + cfg.logins_after_ms
        device = self.rng.integers(0, 4, n)
        rows = np.flatnonzero(picked)
        partition = payments.column("partition").to_numpy()[rows]
        at = ts[rows] - lead[rows]
        order = np.lexsort((at, partition))  # by partition, then as they happened
        rows, partition, at = rows[order], partition[order], at[order]
        counts = np.bincount(partition, minlength=cfg.partitions)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        offset = self.next_offset[partition] + np.arange(len(rows)) - bounds[partition]
        self.next_offset += counts
        self.records += len(rows)
        users = keys.take(pa.array(rows)).to_pylist()
        # a tenth of the records, in Python: short next to the payments' compiled formatter
        values = [
            b'{"user":"%s","device":"d-%d","ts":%d}' % (u, int(d), int(t))
            for u, d, t in zip(users, device[rows].tolist(), at.tolist())
        ]
        m = len(rows)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(partition, pa.int32()),
                pa.array(offset, pa.int64()),
                pa.array(at, pa.timestamp("ms", tz="UTC")),
                pa.array(users, pa.binary()),
                pa.array(values, pa.binary()),
                pa.ListArray.from_arrays(np.zeros(m + 1, np.int32), pa.array([], HEADER_TYPE)),
            ],
            schema=ARROW_SCHEMA,
        )
        return batch, bounds


def generate(cfg: GeneratorConfig, *, progress: bool = True, store: Storage | None = None) -> GenerateResult:
    """Write the archive (and with `logins_out`, the logins topic that goes with it). On
    failure, the chunks this run wrote are removed again."""
    from tqdm import tqdm

    stores = [store or open_storage(cfg.out, threads=cfg.threads)]
    if cfg.logins_out:
        stores.append(open_storage(cfg.logins_out, threads=cfg.threads))
    for s, topic in zip(stores, (cfg.topic, LOGINS_TOPIC)):
        if not cfg.overwrite and s.list():
            raise StorageError(f"{s.url}: destination is not empty; pass --overwrite to replace it")
        if cfg.overwrite:
            s.delete_prefix(f"{topic}/")
    result = GenerateResult(url=stores[0].url)
    started = time.perf_counter()
    draw = _Draw(cfg)
    logins = _Logins(cfg) if cfg.logins_out else None
    bar = tqdm(total=cfg.records, unit="rec", unit_scale=True, disable=not progress, desc="generate", mininterval=0.5)
    with ThreadPoolExecutor(max_workers=cfg.threads) as pool:
        writers = [_ChunkWriter(s, topic, cfg, pool) for s, topic in zip(stores, (cfg.topic, LOGINS_TOPIC))]
        try:
            try:
                remaining = cfg.records
                while remaining:
                    n = min(_STEP_RECORDS, remaining)
                    batch = draw.draw(n)
                    writers[0].add(batch, draw.bounds)
                    if logins is not None:
                        writers[1].add(*logins.follow(batch))
                    remaining -= n
                    bar.update(n)
                for w in writers:
                    w.finish()
            finally:
                for w in writers:
                    w.wait()
        except BaseException:
            for w in writers:
                w.remove()
            raise
        finally:
            bar.close()
    result.records = cfg.records
    result.chunks = sum(w.chunks for w in writers)
    result.bytes = sum(w.bytes for w in writers)
    result.per_partition = {p: int(n) for p, n in enumerate(draw.next_offset) if n}
    result.logins = logins.records if logins else 0
    result.seconds = time.perf_counter() - started
    return result
