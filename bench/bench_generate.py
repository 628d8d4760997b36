"""Generator speed against fastavro's writer, measured in the same run.

    python -m bench.bench_generate [--records 2000000] [--codec snappy]

The baseline is fastavro.writer alone over records that are already Python dicts (the
dict building is not charged to it), writing the same number of records with the same
codec: the speed the issue names as the floor for `keyfill generate`.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import tempfile
import time

import fastavro

from keyfill.synth.generate import GeneratorConfig, generate
from keygroups import envelope


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--codec", default="snappy", choices=envelope.CODECS)
    ap.add_argument("--baseline-records", type=int, default=300_000, help="records fastavro writes")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="keyfill-bench-")
    try:
        warm = GeneratorConfig(out=os.path.join(tmp, "warm"), records=1000, keys=100, headers=True)
        generate(warm, progress=False)  # numba cache load / first compile is not charged

        cfg = GeneratorConfig(
            out=os.path.join(tmp, "gen"),
            records=args.records,
            keys=args.keys,
            headers=True,
            codec=args.codec,
            chunk_records=250_000,
        )
        t = time.perf_counter()
        res = generate(cfg, progress=False)
        gen_s = time.perf_counter() - t

        # Baseline: fastavro writing records of the same archive (first chunk, repeated).
        from compactor.sources.envelope import build_index, read_chunk
        from keygroups.storage import open_storage

        store = open_storage(cfg.out)
        rows = read_chunk(store, build_index(store).all_chunks()[0]).to_pylist()
        for r in rows:
            r["timestamp"] = int(r["timestamp"].timestamp() * 1000)
        records = (rows * (args.baseline_records // len(rows) + 1))[: args.baseline_records]
        buf = io.BytesIO()
        t = time.perf_counter()
        fastavro.writer(buf, envelope.PARSED_SCHEMA, records, codec=args.codec)
        fa_s = time.perf_counter() - t
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    gen_rps = res.records / gen_s
    fa_rps = len(records) / fa_s
    print(f"{'writer':<34} {'records':>10} {'seconds':>8} {'records/s':>11} {'MB/s':>7}")
    print(
        f"{'keyfill generate (' + args.codec + ', headers)':<34} {res.records:>10,} {gen_s:>8.2f} "
        f"{gen_rps:>11,.0f} {res.bytes / 1e6 / gen_s:>7.1f}"
    )
    print(
        f"{'fastavro.writer, dicts prebuilt':<34} {len(records):>10,} {fa_s:>8.2f} "
        f"{fa_rps:>11,.0f} {buf.tell() / 1e6 / fa_s:>7.1f}"
    )
    print(f"ratio keyfill / fastavro: {gen_rps / fa_rps:.2f}x")


if __name__ == "__main__":
    main()
