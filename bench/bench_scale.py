"""The compaction at cluster scale: how its rewrite tasks balance, what more distinct keys
cost, and how it compares with a plain Spark SQL compaction of the same archive.

    python -m bench.bench_scale                                   # 2M records: ~10 minutes
    python -m bench.bench_scale --records 20000000 --keys 10000,1000000,20000000

1. **Balance** at 16, 64 and 1,024 groups: rewrite tasks that received data, from Spark's
   own task metrics (the event log's SparkListenerTaskEnd of the rewrite's shuffle-read
   stage), and the largest task's records over the largest group's, each group's records
   counted in the task that Spark's `repartition` sends its shuffle slot to (the shuffle
   carries runs of records, so Spark's record counts count runs). As many busy tasks as
   groups, and 1.00: one group per task. Spark's hash of the group ids put several groups in
   one task (2.47 at 64).
2. **Distinct keys**: the same record count with 10K, 1M (and more) keys; compaction wall
   time as a ratio to the fewest keys, and the peak resident memory (VmHWM) of the driver's
   Python process, the JVM, and the largest Python worker (sampled from /proc).
3. **Peer**: a hand-written Spark SQL compaction of the same archive (Spark's Avro reader and
   writer by class name, groups by `pmod(xxhash64(key), G)`, fixed time slices, repartition,
   sort within partitions, write partitioned by group), timed in the same session; keyfill's
   time as a ratio to it. The peer does less: no exact packing, no running-maximum slices,
   no checksums, no index, and its groups are unbalanced.

Archives are generated once under --dir and reused (generation is not measured).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import tempfile
import threading
import time

from bench.archives import cached_source


def _proc_peaks(stop: threading.Event, peaks: dict[str, int]) -> None:
    """Peak resident set (VmHWM, kB) of the JVM and of the largest Python worker, sampled:
    the workers are the JVM's children, beyond getrusage's reach."""
    me = os.getpid()
    reset: set[int] = set()
    while not stop.is_set():
        for status in glob.glob("/proc/[0-9]*/status"):
            pid = int(status.split("/")[2])
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read()
                hwm = next(
                    int(line.split()[1]) for line in open(status) if line.startswith("VmHWM:")
                )  # fmt: skip
            except (OSError, StopIteration, ValueError):
                continue
            if pid == me:
                kind = "driver (Python)"
            elif b"java" in cmd and b"spark" in cmd:
                kind = "driver (JVM)"
            elif b"pyspark" in cmd:
                kind = "largest Python worker"
            else:
                continue
            if pid not in reset:  # the peak from here on, not since the process started (Linux: clear_refs 5)
                reset.add(pid)
                try:
                    with open(f"/proc/{pid}/clear_refs", "w") as f:
                        f.write("5")
                    continue
                except OSError:
                    pass
            peaks[kind] = max(peaks.get(kind, 0), hwm)
        stop.wait(0.25)


def _source(root: str, records: int, keys: int, skew: float, codec: str = "null") -> str:
    from keyfill.synth.generate import GeneratorConfig

    return cached_source(
        GeneratorConfig(
            out=os.path.join(root, f"source-{records}-{keys}-{skew}" + ("" if codec == "null" else f"-{codec}")),
            records=records,
            keys=keys,
            partitions=8,
            chunk_records=max(1, records // 100),  # 100 chunks, as the figures
            skew=skew,
            rate=1_000.0,
            codec=codec,
            seed=7,
        )
    )


def _read_through(root: str) -> None:
    """Read every file under root once, so each case starts with its archive in the page
    cache: the archives of a 20M-record run (2.4 GB each) do not all stay cached, and the
    first case read from disk would otherwise pay for it alone."""
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                while f.read(16 << 20):
                    pass


def _rewrite_tasks(event_dir: str, since: float) -> list[int]:
    """Shuffle bytes each task of the last rewrite job's shuffle-read stage received."""
    logs = sorted(glob.glob(os.path.join(event_dir, "*", "events_*")) + glob.glob(os.path.join(event_dir, "*")))
    logs = [p for p in logs if os.path.isfile(p) and os.path.getmtime(p) >= since]
    stages: set[int] = set()
    per_stage: dict[int, list[int]] = {}
    for path in logs:
        for line in open(path):
            ev = json.loads(line)
            kind = ev.get("Event")
            if kind == "SparkListenerJobStart":
                if "rewrite" in (ev.get("Properties") or {}).get("spark.job.description", ""):
                    stages = set(ev["Stage IDs"])
                    per_stage = {}
            elif kind == "SparkListenerTaskEnd" and ev["Stage ID"] in stages:
                read = ev.get("Task Metrics", {}).get("Shuffle Read Metrics", {})
                got = int(read.get("Remote Bytes Read", 0)) + int(read.get("Local Bytes Read", 0))
                per_stage.setdefault(ev["Stage ID"], []).append(got)
    reading = [v for v in per_stage.values() if sum(v)]
    return max(reading, key=len) if reading else []


def _task_records(spark, group_records: list[int]) -> list[int]:
    """Records per rewrite task: each group's records in the task Spark's own `repartition`
    sends its shuffle slot to (the rewrite shuffles runs, so Spark's task metrics count runs,
    and compressed bytes are not proportional to records)."""
    from compactor.group_partitioning import group_slots

    n = len(group_records)
    rows = [(int(s), g) for g, s in enumerate(group_slots(spark, n))]
    placed = spark.createDataFrame(rows, "slot long, grp int").repartition(n, "slot")
    tasks = [0] * n
    for task, grp in placed.selectExpr("spark_partition_id() AS task", "grp").collect():
        tasks[task] += group_records[grp]
    return tasks


def _compact(spark, src: str, dest: str, groups: int, duration: str, exact_keys: int | None = None):
    from compactor.job import CompactConfig, compact

    shutil.rmtree(dest, ignore_errors=True)
    t = time.perf_counter()
    cfg = CompactConfig(
        source=src, dest=dest, groups=groups, slice_duration=duration, seal_all=True, exact_keys=exact_keys
    )
    result = compact(cfg, spark)
    return result, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--keys", default="10000,1000000", help="distinct-key counts to compare (the first: baseline)")
    ap.add_argument("--groups", default="16,64,1024", help="group counts for the balance part")
    ap.add_argument("--peer-records", type=int, default=6_000_000, help="records of the peer comparison's archive")
    ap.add_argument("--slice-duration", default="10m")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", default="/tmp/keyfill-bench-scale")
    ap.add_argument("--skip", default="", help="parts to skip: balance,keys,peer")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each distinct-key case (best kept), interleaved")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    from compactor.spark_session import local_spark
    from keygroups import compacted
    from keygroups.storage import open_storage

    os.makedirs(args.dir, exist_ok=True)
    key_counts = [int(k) for k in args.keys.split(",")]
    sources = {k: _source(args.dir, args.records, k, 0.0 if k > 10_000 else 1.1) for k in key_counts}
    events = tempfile.mkdtemp(prefix="events-", dir=args.dir)
    spark = local_spark(
        args.master,
        app="bench-scale",
        driver_memory="6g",
        progress=False,
        conf={
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": "file://" + events,
            "spark.eventLog.compress": "false",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    work = os.path.join(args.dir, "out")
    base_src = sources[key_counts[0]]

    if "balance" not in skip:
        print(f"\n1. rewrite balance ({args.records:,} records, {key_counts[0]:,} keys with skew 1.1)")
        print(f"  {'groups':>6} {'tasks with records':>19} {'largest task':>13} {'largest group':>14} {'ratio':>6}")
        for g in [int(x) for x in args.groups.split(",")]:
            since = time.time() - 1
            _compact(spark, base_src, work, g, args.slice_duration)
            groups = compacted.load_manifest(open_storage(work)).group_records
            busy = [n for n in _rewrite_tasks(events, since) if n]
            tasks = _task_records(spark, groups)
            print(
                f"  {g:>6} {len(busy):>19,} {max(tasks):>13,} {max(groups):>14,} {max(tasks) / max(groups):>6.2f}",
                flush=True,
            )

    if "keys" not in skip:
        print(f"\n2. distinct keys, {args.records:,} records in 100 chunks, 64 groups")
        stop, peaks = threading.Event(), {}
        _compact(spark, sources[key_counts[0]], work, 64, args.slice_duration)  # warm up: JIT, numba, workers
        runs = [(k, None) for k in key_counts] + [(key_counts[-1], 2**62)]  # last: every key exact, for comparison
        # interleaved, so that a busy stretch of the box spreads over all of them; every key
        # exact once, at the end: its workers' memory would otherwise count as the next run's
        order = [(r, case) for r in range(args.repeat) for case in runs[:-1]] + [(0, runs[-1])]
        best: dict[tuple, tuple] = {}
        high: dict[tuple, dict[str, int]] = {}
        for r, (k, exact) in order:
            stop.clear()
            peaks.clear()
            sampler = threading.Thread(target=_proc_peaks, args=(stop, peaks), daemon=True)
            _read_through(sources[k])
            sampler.start()
            result, seconds = _compact(spark, sources[k], work, 64, args.slice_duration, exact)
            stop.set()
            sampler.join()
            print(f"  run {r + 1}: {k:,} keys{' (all exact)' if exact else ''} {seconds:.1f} s", flush=True)
            if (k, exact) not in best or seconds < best[(k, exact)][1]:
                best[(k, exact)] = (result, seconds)
            for name, kb in peaks.items():
                high.setdefault((k, exact), {})[name] = max(kb, high.get((k, exact), {}).get(name, 0))
        base = best[runs[0]][1]
        print(f"  best of {args.repeat} (every key exact: one run); peak memory: the highest of the runs")
        for k, exact in runs:
            result, seconds = best[(k, exact)]
            mem = ", ".join(f"{name} {kb / 1024:,.0f} MB" for name, kb in sorted(high[(k, exact)].items()))
            print(
                f"  {result.keys:>11,} keys{' (all exact)' if exact else ''}: {seconds:6.1f} s "
                f"({seconds / base:.2f}x the first); "
                f"phases {', '.join(f'{p} {s:.1f}' for p, s in result.phases.items())}; peak {mem}",
                flush=True,
            )

    if "peer" not in skip:
        print(f"\n3. against a hand-written Spark SQL compaction ({args.peer_records:,} records, snappy, 64 groups)")
        from bench.peer_job import peer as run_peer

        peer_src = _source(args.dir, args.peer_records, key_counts[0], 1.1, codec="snappy")
        run_peer(spark, peer_src, work + "-peer", 64, args.slice_duration)  # warm the Avro reader's classes
        peer = ours = float("inf")
        for _ in range(args.repeat):  # interleaved, best kept
            peer = min(peer, run_peer(spark, peer_src, work + "-peer", 64, args.slice_duration))
            ours = min(ours, _compact(spark, peer_src, work, 64, args.slice_duration)[1])
        print(f"  Spark SQL peer {peer:.1f} s; keyfill compact {ours:.1f} s ({ours / peer:.2f}x the peer)")
    spark.stop()


if __name__ == "__main__":
    main()
