"""Appends against full compactions, measured in the same run.

    python -m bench.bench_append                     # 2M records; ~10 minutes on 2 cores
    python -m bench.bench_append --records 500000    # quicker

1. Cost: a source grows by 5% (new chunk files). The append of that 5% onto the archive of
   the first 95% is timed against a full compaction of the grown source (both on the same
   local Spark, started once). The fixed start-up of an append (listing, Spark jobs of a
   few tasks, index and commit: what an append of almost nothing costs) is measured
   separately, as an append of one more chunk file per partition, and reported beside the
   ratio.
   Target (issue 13): append ≤ 10% of the full compaction, start-up apart.
2. Balance: the appended part's group bytes (max / mean) with existing keys kept in their
   groups and new keys placed (`keygroups.place`), against a fresh pack of the appended
   part's keys into as many groups.
3. Replay: the archive grown by 10 appends of 5% each (from 50%) against the one-shot
   compaction of the same grown source: `reader.replay` records/s, runs alternated,
   medians. Target: within 10%.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path


def copy_share(full: str, dest: str, share: float, extra: int = 0) -> int:
    """Copy the first `share` of each partition's chunk files, and `extra` more (a source
    that grows as an archiving connector writes it); returns the chunk files `dest` holds."""
    n = 0
    for root, _, files in os.walk(full):
        names = sorted(f for f in files if f.endswith(".avro"))
        rel = os.path.relpath(root, full)
        for f in names[: round(len(names) * share) + extra]:
            os.makedirs(os.path.join(dest, rel), exist_ok=True)
            if not os.path.exists(os.path.join(dest, rel, f)):
                shutil.copy(os.path.join(root, f), os.path.join(dest, rel, f))
            n += 1
    return n


def phases(r) -> str:
    return "(" + ", ".join(f"{k} {v:.1f}" for k, v in r.phases.items()) + ")"


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def replay_rate(url: str, threads: int) -> tuple[float, int]:
    import reader

    n = 0
    t = time.perf_counter()
    with reader.replay(url, threads=threads) as events:
        for ev in events:
            if isinstance(ev, reader.Records):
                n += ev.batch.num_rows
    return n / (time.perf_counter() - t), n


def appended_balance(src: str, dest: str, version: int) -> tuple[float, float]:
    """(max/mean of the appended part's group bytes as placed, the same for a fresh pack of
    the appended part's keys), for the records `version` added."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    import keygroups
    from compactor.sources import open_source
    from keygroups import compacted, envelope
    from keygroups.assignment import KeyAssignment, load_assignment
    from keygroups.storage import open_storage

    store = open_storage(dest)
    new, old = compacted.load_manifest(store, version), compacted.load_manifest(store, version - 1)
    source = open_source(src)
    parts = []
    for chunk in source.list_chunks():
        b = source.read(chunk)
        lo, hi = old.handoff.get(str(chunk.partition), 0), new.handoff.get(str(chunk.partition), 0)
        off = b.column("offset")
        b = b.filter(pc.and_(pc.greater_equal(off, lo), pc.less(off, hi)))
        if b.num_rows:
            parts.append(
                pa.table(
                    {
                        "key": b.column("key"),
                        "partition": b.column("partition"),
                        "bytes": envelope.record_bytes(b),
                    }
                )
            )
    t = pa.concat_tables(parts)
    groups = KeyAssignment.from_table(load_assignment(store, new.assignment)).group_of(
        t.column("key").combine_chunks(), t.column("partition").to_numpy()
    )
    weights = t.column("bytes").to_numpy()
    placed = np.bincount(groups, weights=weights, minlength=new.groups)
    # a fresh pack of the appended part: per key (null keys per partition), then packed
    keyed = pa.table({"key": t.column("key"), "p": pc.if_else(pc.is_null(t.column("key")), t.column("partition"), -1)})
    keyed = keyed.append_column("bytes", t.column("bytes"))
    per_key = keyed.group_by(["key", "p"]).aggregate([("bytes", "sum")]).column("bytes_sum").to_numpy()
    fresh = keygroups.group_loads(per_key, keygroups.pack(per_key, new.groups), new.groups)
    return float(placed.max() / placed.mean()), float(fresh.max() / fresh.mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--slice-duration", default="1m")
    ap.add_argument("--threads", type=int, nargs="+", default=[4, 16], help="replay thread counts")
    ap.add_argument("--skew", type=float, default=1.1, help="Zipf exponent of the generated keys' volume")
    ap.add_argument("--runs", type=int, default=5, help="replay runs per archive (alternated)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", default="/tmp/keyfill-bench-append")
    args = ap.parse_args()

    from compactor.job import CompactConfig, compact
    from compactor.spark_session import local_spark
    from keyfill.synth.generate import GeneratorConfig, generate

    # 200 chunk files per partition: 5% of the source is 10 new files per partition.
    chunk_records = max(1_000, args.records // (args.partitions * 200))
    full = os.path.join(args.dir, f"full-{args.records}-{args.skew}")
    if not os.path.exists(os.path.join(full, "_done")):
        shutil.rmtree(args.dir, ignore_errors=True)
        print(f"generating {args.records:,} records ...", flush=True)
        generate(
            GeneratorConfig(
                out=full,
                records=args.records,
                keys=args.keys,
                partitions=args.partitions,
                chunk_records=chunk_records,
                headers=True,
                skew=args.skew,
                rate=200.0,  # 2M records: 2.8 hours of event time, so 5% is ~8 one-minute slices
            ),
            progress=False,
        )
        Path(full, "_done").touch()
    spark = local_spark(args.master, app="keyfill bench_append", progress=False)
    spark.sparkContext.setLogLevel("ERROR")
    work = os.path.join(args.dir, "work")
    shutil.rmtree(work, ignore_errors=True)

    def cfg(src: str, dest: str, **kw) -> CompactConfig:
        return CompactConfig(source=src, dest=dest, slice_duration=args.slice_duration, **kw)

    # warm-up: the first Spark jobs of a session pay for worker start-up and JIT
    warm = os.path.join(work, "warm")
    copy_share(full, warm, 0.05)
    compact(cfg(warm, os.path.join(work, "warm-c"), seal_all=True), spark)

    # 1. cost of a 5% append against a full compaction of the grown source
    grown, base = os.path.join(work, "grown"), os.path.join(work, "base")
    copy_share(full, grown, 1.0)
    r_full, t_full = timed(lambda: compact(cfg(grown, os.path.join(work, "full-c")), spark))
    copy_share(full, base, 0.95)
    dest = os.path.join(work, "appended-c")
    compact(cfg(base, dest), spark)
    copy_share(full, base, 1.0)
    r_app, t_app = timed(lambda: compact(cfg(base, dest, append=True), spark))
    # fixed start-up: an append of almost nothing (one more chunk file per partition, all
    # of it published with --seal-all)
    tiny_src, tiny_dest = os.path.join(work, "tiny"), os.path.join(work, "tiny-c")
    copy_share(full, tiny_src, 0.95)
    compact(cfg(tiny_src, tiny_dest), spark)
    copy_share(full, tiny_src, 0.95, extra=1)
    r_tiny, t_tiny = timed(lambda: compact(cfg(tiny_src, tiny_dest, append=True, seal_all=True), spark))
    balance, fresh = appended_balance(base, dest, r_app.version)

    # 3. replay after 10 appends against the one-shot compaction of the same source
    ten_src, ten_dest = os.path.join(work, "ten"), os.path.join(work, "ten-c")
    copy_share(full, ten_src, 0.5)
    compact(cfg(ten_src, ten_dest), spark)
    append_times = []
    for i in range(1, 11):
        copy_share(full, ten_src, 0.5 + 0.05 * i)
        step = cfg(ten_src, ten_dest, append=True, seal_all=i == 10)
        append_times.append(timed(lambda step=step: compact(step, spark))[1])
    one_dest = os.path.join(work, "one-c")
    r_one = compact(cfg(ten_src, one_dest, seal_all=True), spark)
    spark.stop()
    rates: dict[tuple[str, int], list[float]] = {}
    counts = set()
    for _ in range(args.runs):
        for threads in args.threads:
            for label, url in (("one-shot", one_dest), ("10 appends", ten_dest)):
                rate, n = replay_rate(url, threads)
                rates.setdefault((label, threads), []).append(rate)
                counts.add(n)
    assert len(counts) == 1, f"the two archives replay different record counts: {counts}"
    from keygroups import compacted
    from keygroups.storage import open_storage

    ten = compacted.load_manifest(open_storage(ten_dest))

    print(
        f"\n{args.records:,} records, {args.keys:,} keys (skew {args.skew}), {args.partitions} partitions, slices of "
        f"{args.slice_duration}, {args.master}"
    )
    print("\n1. append of 5% new data against a full compaction of the grown source")
    print(f"  full compaction ({r_full.records:,} records):          {t_full:7.1f} s  {phases(r_full)}")
    print(f"  append of 5% ({r_app.new_records:,} records published):  {t_app:7.1f} s  {phases(r_app)}")
    print(
        f"  append of 1 chunk per partition (fixed start-up, {r_tiny.new_records:,} records): {t_tiny:7.1f} s  "
        f"{phases(r_tiny)}"
    )
    print(
        f"  append / full = {t_app / t_full:.3f}; start-up apart: ({t_app:.1f} - {t_tiny:.1f}) / {t_full:.1f} = "
        f"{(t_app - t_tiny) / t_full:.3f}  (target <= 0.10)"
    )
    print("\n2. group balance of the appended part (max / mean group bytes)")
    print(
        f"  existing keys kept, new keys placed: {balance:.3f}   fresh pack of the appended part: {fresh:.3f}  "
        f"ratio {balance / fresh:.3f}"
    )
    print(
        f"\n3. replay (reader.replay), medians of {args.runs} alternated runs; the one-shot archive has "
        f"{r_one.files} files, the appended one {ten.totals.files} ({len(ten.runs)} runs)"
    )
    for threads in args.threads:
        one_rate = statistics.median(rates[("one-shot", threads)])
        ten_rate = statistics.median(rates[("10 appends", threads)])
        print(
            f"  {threads:2d} threads: one-shot {one_rate / 1e6:.3f}M rec/s, "
            f"after 10 appends {ten_rate / 1e6:.3f}M rec/s: "
            f"ratio {ten_rate / one_rate:.3f}  (target >= 0.90)"
        )
    print(f"  append times: {', '.join(f'{t:.1f}' for t in append_times)} s")


if __name__ == "__main__":
    main()
