"""The compaction against a hand-written Spark SQL job over the same archive, two ways, in one run:

1. **own clocks**, in one local Spark session: `compact()`'s own phases (statistics, rewrite,
   the rest) against the peer's job, from its read to its last file written;
2. **whole commands**, as a user times them: `keyfill compact ... --master local[2]` against
   `python -m bench.peer_job ...` (the same peer in its own local[2] session), each from
   the shell's fork to its exit: Python and JVM start-up, listing, commit and all.

    python -m bench.bench_peer                      # 6M records, 200K keys (generated once, cached)
    python -m bench.bench_peer --records 10000000
    python -m bench.bench_peer --quick              # 1M records, one round

The archive (the bars' shape): --records records over --keys keys with skew 1.1, headers, 8
partitions, 100 chunks, snappy. Both compact it into 64 groups with 10-minute slices; keyfill
with `--seal-all` so that both write every record. The peer (bench/peer_job.py) does less:
no exact packing, no running-maximum slices, no checksums, no piece index, unbalanced groups.
Runs alternate (peer, keyfill, peer, ...), best of --repeat. Targets: keyfill <= 0.5x the peer
on the own clocks, <= 0.6x as whole commands.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

from bench.archives import cached_source

OWN_TARGET, WHOLE_TARGET = 0.5, 0.6
GROUPS, SLICE = 64, "10m"


def source(root: str, records: int, keys: int) -> str:
    from keyfill.synth.generate import GeneratorConfig

    return cached_source(
        GeneratorConfig(
            out=os.path.join(root, f"source-{records}-{keys}"),
            records=records,
            keys=keys,
            partitions=8,
            chunk_records=max(1, records // 100),
            skew=1.1,
            headers=True,
            rate=1_000.0,
            codec="snappy",
            seed=7,
        )
    )


def own_keyfill(spark, src: str, dest: str) -> tuple[float, dict[str, float]]:
    from compactor.job import CompactConfig, compact

    shutil.rmtree(dest, ignore_errors=True)
    t = time.perf_counter()
    result = compact(CompactConfig(source=src, dest=dest, groups=GROUPS, slice_duration=SLICE, seal_all=True), spark)
    return time.perf_counter() - t, dict(result.phases)


def whole(argv: list[str]) -> float:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    t = time.perf_counter()
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=None, help="records (default 6M; --quick 1M)")
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=None, help="rounds, best kept (default 2; --quick 1)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip", default="", help="parts to skip: own,whole")
    ap.add_argument("--dir", default="/tmp/keyfill-bench-peer")
    args = ap.parse_args()
    records = args.records or (1_000_000 if args.quick else 6_000_000)
    repeat = args.repeat or (1 if args.quick else 2)
    skip = set(filter(None, args.skip.split(",")))
    os.makedirs(args.dir, exist_ok=True)
    src = source(args.dir, records, args.keys)
    out, peer_out = os.path.join(args.dir, "keyfill-out"), os.path.join(args.dir, "peer-out")

    if "own" not in skip:
        from bench.peer_job import peer
        from compactor.spark_session import local_spark

        spark = local_spark("local[2]", app="keyfill bench peer", progress=False)
        spark.sparkContext.setLogLevel("ERROR")
        peer(spark, src, peer_out, GROUPS, SLICE)  # warm: the Avro classes, the workers, numba
        own_keyfill(spark, src, out)
        peers, ours = [], []
        for i in range(repeat):
            peers.append(peer(spark, src, peer_out, GROUPS, SLICE))
            ours.append(own_keyfill(spark, src, out))
            phases = ", ".join(f"{k} {v:.1f}" for k, v in ours[-1][1].items())
            print(f"round {i + 1}: peer {peers[-1]:.1f} s; keyfill {ours[-1][0]:.1f} s ({phases})", flush=True)
        spark.stop()
        best_peer = min(peers)
        best, phases = min(ours, key=lambda r: r[0])
        mark = "ok" if best / best_peer <= OWN_TARGET else "high"
        print(f"\n1. own clocks, {records:,} records, {args.keys:,} keys, local[2], best of {repeat}")
        print(f"{'job':<10}{'seconds':>9}{'ratio':>8}  phases")
        print(f"{'peer':<10}{best_peer:>9.1f}{1:>7.2f}x")
        detail = ", ".join(f"{k} {v:.1f}" for k, v in phases.items())
        print(f"{'keyfill':<10}{best:>9.1f}{best / best_peer:>7.2f}x  {detail}  ({mark}: target {OWN_TARGET}x)")

    if "whole" not in skip:
        py = sys.executable
        keyfill = os.path.join(os.path.dirname(py), "keyfill")
        ours_cmd = [keyfill, "compact", src, out, "--groups", str(GROUPS), "--slice-duration", SLICE]
        ours_cmd += ["--seal-all", "--overwrite", "--master", "local[2]"]
        peer_cmd = [py, "-m", "bench.peer_job", src, peer_out, "--groups", str(GROUPS), "--slice-duration", SLICE]
        peer_w, ours_w = [], []
        for i in range(repeat):
            peer_w.append(whole(peer_cmd))
            ours_w.append(whole(ours_cmd))
            print(f"round {i + 1}: peer command {peer_w[-1]:.1f} s; keyfill compact {ours_w[-1]:.1f} s", flush=True)
        p, k = min(peer_w), min(ours_w)
        mark = "ok" if k / p <= WHOLE_TARGET else "high"
        print(f"\n2. whole commands, {records:,} records, best of {repeat}")
        print(f"{'command':<18}{'seconds':>9}{'ratio':>8}")
        print(f"{'peer_job':<18}{p:>9.1f}{1:>7.2f}x")
        print(f"{'keyfill compact':<18}{k:>9.1f}{k / p:>7.2f}x  ({mark}: target {WHOLE_TARGET}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
