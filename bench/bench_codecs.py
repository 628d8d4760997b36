"""Decode speed and size of group files per Avro codec and block size, measured in one run:
the measurement behind the compactor's defaults (--codec snappy, --block-bytes 1 MiB).

    python -m bench.bench_codecs [--records 500000]
"""

from __future__ import annotations

import argparse
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=500_000)
    args = ap.parse_args()

    import pyarrow as pa

    from compactor.sources.envelope import build_index, read_chunk
    from keyfill.synth.generate import GeneratorConfig, generate
    from keygroups import envelope
    from keygroups.storage import open_storage

    with tempfile.TemporaryDirectory() as tmp:
        generate(
            GeneratorConfig(
                out=tmp, records=args.records, partitions=1, chunk_records=args.records, headers=True, keys=100_000
            ),
            progress=False,
        )
        store = open_storage(tmp)
        batch = read_chunk(store, build_index(store).all_chunks()[0])
    batch = pa.Table.from_batches([batch]).combine_chunks().to_batches()[0]
    envelope.decode_avro(envelope.encode_avro(batch.slice(0, 100), codec="snappy"))  # warm the compiled code

    rows = []
    for codec in envelope.CODECS:
        for block in (64 << 10, 256 << 10, 1 << 20, 4 << 20):
            data = envelope.encode_avro(batch, codec=codec, block_bytes=block)
            best = min(_timed(lambda data=data: envelope.decode_avro(data)) for _ in range(3))
            rows.append((codec, block, len(data), best))
    base = next(r[3] for r in rows if r[0] == "null" and r[1] == 1 << 20)
    print(f"{args.records:,} envelope records (JSON payments with headers), compiled decoder, best of 3")
    print(f"{'codec':<8} {'block':>7} {'MB':>7} {'records/s':>11} {'vs null 1 MiB':>13}")
    for codec, block, size, secs in rows:
        print(f"{codec:<8} {block >> 10:>6}K {size / 1e6:>7.1f} {args.records / secs:>11,.0f} {base / secs:>12.2f}x")


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
