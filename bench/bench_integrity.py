"""What the replay's integrity check costs: `reader.replay` with every piece's length,
CRC-32C and record count checked before it is emitted (what ships), against the same replay
with the checksum step taken out (baseline) and with a SHA-256 of the piece computed in its
place (the rejected alternative), alternating in one run on one archive.

    python -m bench.bench_integrity            # 4M records (~650 MB), generated and compacted once, cached
    python -m bench.bench_integrity --quick    # 300K records

Also prints both checksums' raw speed on this machine.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time
from pathlib import Path

import reader
from bench.archives import cached_compacted
from keygroups import compacted, envelope


def ensure_archive(args: argparse.Namespace) -> str:
    from compactor.spark_session import local_spark

    sessions = []

    def spark():
        sessions.append(local_spark("local[2]", app="bench-integrity", progress=False))
        return sessions[-1]

    try:
        return cached_compacted(args.dir, args.records, args.groups, "10m", spark, chunk_records=100_000)
    finally:
        for session in sessions:
            session.stop()


def _variant(check):
    """read_span with `check(piece bytes)` as its checksum step."""

    def decode(
        header: bytes, data: bytes, start: int, pieces: list[compacted.Piece], name: str, *, headers: bool = True
    ):
        for p in pieces:
            chunk = data[p.offset - start : p.end - start]
            if len(chunk) != p.length or not check(chunk):
                raise compacted.IntegrityError(name)
        piece_bytes = data[pieces[0].offset - start : pieces[-1].end - start]
        _, batch = envelope.decode_avro(header + piece_bytes, name=name, headers=headers)
        if batch.num_rows != sum(p.records for p in pieces):
            raise compacted.IntegrityError(name)
        return batch

    return decode


VARIANTS = {
    "crc32c (ships)": compacted.read_span,
    "sha256": _variant(lambda data: len(hashlib.sha256(data).hexdigest()) == 64),
    "no checksum": _variant(lambda data: True),
}


def replay_rate(url: str, threads: int) -> float:
    started = time.perf_counter()
    n = 0
    with reader.replay(url, threads=threads) as events:
        for ev in events:
            if isinstance(ev, reader.Records):
                n += ev.batch.num_rows
    return n / (time.perf_counter() - started)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=4_000_000)
    p.add_argument("--groups", type=int, default=64)
    p.add_argument("--threads", type=int, nargs="+", default=[4, 16])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default=os.path.join(Path.home(), ".cache", "keyfill-bench", "integrity"))
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.records, args.rounds = 300_000, 2
    url = ensure_archive(args)

    files = [p for p in Path(url).rglob("*.avro")]
    blob = b"".join(f.read_bytes() for f in files[:64])
    for name, fn in (("SHA-256", lambda b: hashlib.sha256(b).hexdigest()), ("CRC-32C", compacted.crc32c)):
        t = time.perf_counter()
        fn(blob)
        print(
            f"{name} alone: {len(blob) / (time.perf_counter() - t) / 1e9:.2f} GB/s on one core "
            f"({len(blob) / 1e6:.0f} MB)"
        )
    total = sum(f.stat().st_size for f in files)
    print(f"archive: {len(files)} segment files, {total / 1e6:.0f} MB, {args.records:,} records")

    shipped = compacted.read_span
    replay_rate(url, args.threads[0])  # warm the page cache and numba
    for threads in args.threads:
        rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for _ in range(args.rounds):
            for name, fn in VARIANTS.items():
                compacted.read_span = fn
                try:
                    rates[name].append(replay_rate(url, threads))
                finally:
                    compacted.read_span = shipped
        med = {k: statistics.median(v) for k, v in rates.items()}
        base = med["no checksum"]
        print(
            f"{threads:>2} threads (medians of {args.rounds}): "
            + ", ".join(f"{k} {v / 1e6:.2f}M records/s = {v / base:.3f}x" for k, v in med.items())
        )


if __name__ == "__main__":
    main()
