"""The v2 piece index at scale: planning a micro-batch, or resuming, over a synthetic index
of 10^6 slices x 1,024 groups (up to 10^9 piece rows), against reading the whole index
file that holds those slices (the baseline: what a reader without row-group reads pays).

    python -m bench.bench_index            # 1,024 groups, dense: every group has a piece in every slice
    python -m bench.bench_index --quick    # 256 groups

Planning touches only the index files of the slices it needs (their names follow from the
slice numbers), so the benchmark writes the two files that cover the planned ranges, full
size, and none of the other ~244 (their presence would change nothing that is measured;
`write_index` writes each file independently). Timed cold: a new `PieceIndex` per plan,
files in the page cache.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import pyarrow as pa

from keygroups import layout
from keygroups import piece_index as ix
from keygroups.storage import open_storage

SLICES = 1_000_000
RUN = "0123456789abcdef"  # the one run that wrote the synthetic index


class CountingStore:
    def __init__(self, inner) -> None:
        self._inner = inner
        self.gets = 0
        self.bytes = 0

    def read(self, key: str) -> bytes:
        data = self._inner.read(key)
        self.gets += 1
        self.bytes += len(data)
        return data

    def read_range(self, key: str, start: int, length: int) -> bytes:
        data = self._inner.read_range(key, start, length)
        self.gets += 1
        self.bytes += len(data)
        return data

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def synthetic_file(first: int, groups: int, rng: np.random.Generator) -> tuple[pa.Table, pa.Table]:
    """The slices and pieces of one index file: every group has a piece in every slice,
    segments of ~64 MiB cut every 600 slices."""
    s = np.arange(first, min(first + ix.SLICES_PER_FILE, SLICES), dtype=np.int64)
    n = len(s)
    records = rng.integers(50, 5000, size=(n, groups))
    length = records * 160
    slices = pa.table(
        {
            "slice": s,
            "start_ms": s * 10_000,
            "end_ms": (s + 1) * 10_000,
            "records": records.sum(axis=1),
            "bytes": length.sum(axis=1),
            "partitions": pa.array([[]] * n, pa.list_(ix.PARTITION_RANGE)),
        }
    )
    ps = np.repeat(s, groups)
    pg = np.tile(np.arange(groups, dtype=np.int32), n)
    seg = ps // 600
    files = pa.array([f"groups/{g:05d}/{q:010d}-{RUN}.avro" for g, q in zip(pg.tolist(), seg.tolist())])
    flat = length.reshape(-1)
    header = 400
    pieces = pa.table(
        {
            "slice": ps,
            "group": pg,
            "file": files,
            "offset": np.cumsum(flat) - flat + header,
            "length": flat,
            "records": records.reshape(-1),
            "min_timestamp": ps * 10_000,
            "max_timestamp": ps * 10_000 + 9_999,
            "crc32c": rng.integers(0, 2**32, size=ps.size, dtype=np.uint32),
            "file_header": np.full(ps.size, header, np.int32),
            "file_bytes": np.full(ps.size, header + int(flat.sum()), np.int64),  # bounds every offset (synthetic)
        }
    )
    return slices, pieces


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=1024)
    ap.add_argument("--batch-slices", type=int, default=4, help="slices per planned micro-batch")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    groups = 256 if args.quick else args.groups
    rng = np.random.default_rng(1)
    root = tempfile.mkdtemp(prefix="keyfill-bench-index-")
    store = open_storage(root)
    t = time.perf_counter()
    plans = [("micro-batch in the middle", 500_000), ("resume at the last slice", SLICES - args.batch_slices)]
    for _, first in plans:
        slices, pieces = synthetic_file(ix.file_start(first), groups, rng)
        ix.write_index(store, slices, pieces, RUN)
    files = sorted(os.listdir(os.path.join(root, ix.INDEX)))
    sizes = {f: os.path.getsize(os.path.join(root, ix.INDEX, f)) for f in files}
    rows = ix.SLICES_PER_FILE * groups  # the middle file's
    print(
        f"synthetic index: {SLICES:,} slices x {groups:,} groups = {SLICES * groups:,} pieces in "
        f"{-(-SLICES // ix.SLICES_PER_FILE)} file pairs; wrote the 2 pairs planned against "
        f"({rows:,} piece rows each, pieces file {max(v for k, v in sizes.items() if 'pieces' in k) / 1e6:.1f} MB) "
        f"in {time.perf_counter() - t:.1f} s"
    )
    print("the manifest holds the slice count and where the index's writing run changes: not the index's size")
    for label, first in plans:
        end = first + args.batch_slices
        best = {}
        for how in ("row groups", "whole file"):
            times = []
            for _ in range(5):
                counting = CountingStore(store)
                t = time.perf_counter()
                if how == "row groups":
                    index = ix.PieceIndex(counting, SLICES, [[0, RUN]])
                    got = index.piece_rows(first, end).num_rows + index.slice_rows(first, end).num_rows
                else:  # baseline: fetch the index files whole, then filter
                    import pyarrow.compute as pc
                    import pyarrow.parquet as pq

                    got = 0
                    for kind in ("pieces", "slices"):
                        table = pq.read_table(
                            pa.BufferReader(counting.read(layout.index_key(kind, ix.file_start(first), RUN)))
                        )
                        col = table.column("slice")
                        got += table.filter(pc.and_(pc.greater_equal(col, first), pc.less(col, end))).num_rows
                times.append(time.perf_counter() - t)
            assert got == args.batch_slices * (groups + 1)
            best[how] = (min(times), counting.gets, counting.bytes)
        (t_rg, g_rg, b_rg), (t_w, g_w, b_w) = best["row groups"], best["whole file"]
        print(
            f"{label} ({args.batch_slices} slices, {args.batch_slices * groups:,} pieces): "
            f"row-group reads {t_rg * 1000:.0f} ms, {g_rg} GETs, {b_rg / 1e6:.2f} MB; "
            f"whole index file {t_w * 1000:.0f} ms, {g_w} GETs, {b_w / 1e6:.1f} MB; "
            f"{t_w / t_rg:.1f}x faster, {b_w / max(b_rg, 1):.0f}x fewer bytes"
        )


if __name__ == "__main__":
    main()
