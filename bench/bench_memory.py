"""What the read-ahead budget bounds: peak RSS of a replay and of a Spark query whose consumer is
slower than the reader, at two budgets, over an archive whose slices are far larger than
either; and what the bound costs a fast consumer.

    python -m bench.bench_memory            # 6M records, 64 groups, 1 h slices (~340 MB; made once, cached)
    python -m bench.bench_memory --quick    # 600K records, 10 min slices

Rows, each in a child process of its own, so its peak RSS (`ru_maxrss`) is its own:
- replay, slow consumer: `reader.replay` (4 threads) with a consumer that sleeps 2 ms on every
  batch of --batch-size records, over the first --records-slow records; the process's RSS once
  the replay is open (imports, manifest, index cache: its baseline), its peak, and the bytes
  the reader counted as held at most (`ReadBudget.peak`).
- `keyfill replay`: the CLI over the whole archive (a null sink: the fast consumer), its
  records/s and peak RSS.
- Spark, slow sink: a local[2] query `format("keyfill")` -> mapInArrow that sleeps 20 ms on
  every Arrow batch -> noop sink, one micro-batch (maxSlicesPerTrigger=1); the peak RSS of the
  largest Python worker (the task that reads the source), sampled from /proc every 50 ms.

Each row at readAheadBytes 64 MiB and 2 GiB. The fast-consumer ratio (64 MiB / 2 GiB) is
what the bound costs a consumer that keeps up.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time

MiB = 1 << 20


def rss_mb(pid: str | int = "self") -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def child_replay(url: str, read_ahead: int, records: int, batch: int) -> None:
    """In the child: a replay with a slow consumer; prints its figures as JSON."""
    import reader

    n, t0 = 0, time.perf_counter()
    with reader.replay(url, threads=4, read_ahead_bytes=read_ahead, batch_size=batch) as events:
        base = rss_mb()
        for ev in events:
            if isinstance(ev, reader.Records):
                n += ev.batch.num_rows
                time.sleep(0.002)
                if n >= records:
                    break
        held = events.budget.peak
    print(json.dumps({"records": n, "seconds": time.perf_counter() - t0, "base_mb": base, "held": held}))


def run_child(args: list[str]) -> tuple[str, float]:
    """A child process's stdout and its peak RSS in MB."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(args)} failed")
    return out, usage.ru_maxrss / 1024


def descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parents[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, todo = [], [root]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        found.extend(kids)
        todo.extend(kids)
    return found


def python_workers(root: int) -> list[int]:
    out = []
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"pyspark" in cmd and b"java" not in cmd:
            out.append(pid)
    return out


def slow_batches(batches):
    for b in batches:
        time.sleep(0.02)
        yield b


def spark_row(spark, url: str, read_ahead: int, batch: int, ck: str) -> tuple[int, float]:
    """One micro-batch through a slow mapInArrow into a noop sink; the largest Python
    worker's peak RSS (MB) while it ran."""
    df = (
        spark.readStream.format("keyfill")
        .option("readAheadBytes", str(read_ahead))
        .option("maxSlicesPerTrigger", "1")
        .option("batchSize", str(batch))
        .load(url)
        .select("key", "timestamp", "value")
    )
    slow = df.mapInArrow(slow_batches, df.schema)
    peak, stop = [0.0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for pid in python_workers(os.getpid()):
                peak[0] = max(peak[0], rss_mb(pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    q = slow.writeStream.format("noop").option("checkpointLocation", ck).trigger(once=True).start()
    q.awaitTermination()
    stop.set()
    sampler.join()
    rows = sum(p["numInputRows"] for p in q.recentProgress)
    return rows, peak[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dir", default="/tmp/keyfill-bench-memory", help="archive cache")
    ap.add_argument("--records-slow", type=int, default=None, help="records the slow replay consumer takes")
    ap.add_argument("--batch-size", type=int, default=10_000)
    ap.add_argument("--no-spark", action="store_true")
    ap.add_argument("--child", nargs=4, metavar=("URL", "READ_AHEAD", "RECORDS", "BATCH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        url, ra, n, b = args.child
        child_replay(url, int(ra), int(n), int(b))
        return
    from bench.archives import cached_compacted
    from compactor.spark_session import local_spark

    records, slices = (600_000, "10m") if args.quick else (6_000_000, "1h")
    slow_n = args.records_slow or records // 4
    spark = None

    def session():
        nonlocal spark
        if spark is None:
            spark = local_spark("local[2]", app="keyfill bench memory", progress=False)
            spark.sparkContext.setLogLevel("ERROR")
        return spark

    url = cached_compacted(args.dir, records, 64, slices, session, seal_all=True)
    budgets = [64 * MiB, 2048 * MiB]
    print(f"\n{records:,} records, 64 groups, {slices} slices, at {url}")
    print(f"{'row':<44} {'read-ahead':>10} {'records/s':>10} {'baseline MB':>12} {'peak RSS MB':>12} {'held MiB':>9}")
    fast: dict[int, float] = {}
    for ra in budgets:
        out, peak = run_child(
            [sys.executable, "-m", "bench.bench_memory", "--child", url, str(ra), str(slow_n), str(args.batch_size)]
        )
        r = json.loads(out.strip().splitlines()[-1])
        label = f"replay, slow consumer ({r['records']:,} records)"
        print(
            f"{label:<44} {ra // MiB:>7} MiB {r['records'] / r['seconds']:>10,.0f} {r['base_mb']:>12.0f} "
            f"{peak:>12.0f} {r['held'] / MiB:>9.1f}"
        )
    for ra in budgets:
        best = 0.0
        for _ in range(2):
            out, peak = run_child(["keyfill", "replay", url, "--read-ahead-bytes", str(ra), "--json"])
            summary = json.loads(out)
            best = max(best, summary["records"] / summary["seconds"])
        fast[ra] = best
        label = "keyfill replay (fast consumer, best of 2)"
        print(f"{label:<44} {ra // MiB:>7} MiB {best:>10,.0f} {'':>12} {peak:>12.0f}")
    if not args.no_spark:
        s = session()
        import reader.spark as rs

        rs.register(s)
        for ra in budgets:
            t0 = time.perf_counter()
            rows, peak = spark_row(s, url, ra, args.batch_size, os.path.join(args.dir, f"ck-{ra}-{time.time_ns()}"))
            rate = rows / (time.perf_counter() - t0)
            label = f"Spark, slow sink (1 batch, {rows:,} rows)"
            print(f"{label:<44} {ra // MiB:>7} MiB {rate:>10,.0f} {'':>12} {peak:>12.0f}")
    print(f"\nfast consumer, 64 MiB / 2 GiB read-ahead: {fast[budgets[0]] / fast[budgets[1]]:.2f}x records/s")
    print(f"(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB peak)")


if __name__ == "__main__":
    main()
