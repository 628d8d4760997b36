"""What the read-ahead budget bounds: peak RSS of a replay and of a Spark query whose consumer is
slower than the reader, at two budgets, over an archive whose slices are far larger than
either; what the bound costs a fast consumer; and what mapping large buffers
(`reader.memory.map_large_buffers`, on unless KEYFILL_MMAP_THRESHOLD=0) does to both.

    python -m bench.bench_memory            # 6M records, 64 groups, 1 h slices (~340 MB; made once, cached)
    python -m bench.bench_memory --quick    # 600K records, 10 min slices
    python -m bench.bench_memory --huge     # 18M records, one key 60% of them: a piece of ~550 MB
    python -m bench.bench_memory --against REV   # also the fast consumer of git revision REV, alternating

Rows, each in a child process of its own; its peak RSS is the kernel's high-water mark of
that process (VmHWM, read from /proc while it runs: `ru_maxrss` of a child counts its
parent's RSS at the fork):
- replay, slow consumer: `reader.replay` (4 threads) with a consumer that sleeps 2 ms on every
  batch of --batch-size records, over the first --records-slow records; the RSS once the first
  records came (warmed up: kernels loaded, the first read-ahead filled), the peak, the peak
  over the warmed-up RSS against the goal (read-ahead + 192 MB), and the bytes the reader
  counted as held at most (`ReadBudget.peak`). With large buffers mapped (the default) and
  with the allocator left alone.
- `keyfill replay`: the CLI over the whole archive (a null sink: the fast consumer), its
  records/s (best of 3, the two allocator settings alternating) and peak RSS.
- Spark, slow sink: a local[2] query `format("keyfill")` -> mapInArrow that sleeps 20 ms on
  every Arrow batch -> noop sink, one micro-batch (maxSlicesPerTrigger=1); the peak RSS of the
  largest Python worker (the task that reads the source), sampled from /proc every 50 ms.

Each row at readAheadBytes 64 MiB and 2 GiB. The fast-consumer ratios are what the bound
costs a consumer that keeps up (64 MiB / 2 GiB), and what mapping large buffers costs it
(mapped / left alone). `--against REV`: the CLI of revision REV (a git worktree of this
checkout, on this Python) replays beside this tree's, alternating, and the ratio is printed.

`--huge`: the shape where a piece is far larger than the read-ahead (one key with 60% of the
records, all in one 1 h slice): at 64 MiB, a replay with a slow and with a fast consumer
(the same child, no sleep), their peak RSS over the warmed-up RSS against the goal, and the
Spark row.
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


def status_mb(field: str, pid: str | int = "self") -> float:
    """A /proc/<pid>/status field in MB (VmRSS, VmHWM); 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def rss_mb(pid: str | int = "self") -> float:
    return status_mb("VmRSS", pid)


def child_replay(url: str, read_ahead: int, records: int, batch: int, pause: float = 0.002) -> None:
    """In the child: a replay with a consumer that sleeps `pause` s per batch; prints its figures as JSON."""
    import reader

    n, t0, warm = 0, time.perf_counter(), 0.0
    with reader.replay(url, threads=4, read_ahead_bytes=read_ahead, batch_size=batch) as events:
        for ev in events:
            if isinstance(ev, reader.Records):
                warm = warm or rss_mb()
                n += ev.batch.num_rows
                if pause:
                    time.sleep(pause)
                if n >= records:
                    break
        held = events.budget.peak
    out = {"records": n, "seconds": time.perf_counter() - t0, "warm_mb": warm, "held": held}
    print(json.dumps({**out, "peak_mb": status_mb("VmHWM")}))


def run_child(args: list[str], env: dict[str, str] | None = None) -> tuple[str, float, float]:
    """A child process's stdout, its peak RSS in MB (VmHWM, polled until it exits) and its
    CPU seconds (user + system: less swayed than wall time by a busy machine)."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    peak, done = [0.0], threading.Event()

    def poll() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], status_mb("VmHWM", proc.pid))
            time.sleep(0.02)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    poller.join()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(args)} failed")
    return out, peak[0], usage.ru_utime + usage.ru_stime


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


def worktree(rev: str) -> str:
    """A git worktree of revision `rev` of this checkout (made once, reused)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sha = subprocess.check_output(["git", "-C", here, "rev-parse", "--short", rev], text=True).strip()
    path = f"/tmp/keyfill-bench-at-{sha}"
    if not os.path.exists(path):
        subprocess.check_call(["git", "-C", here, "worktree", "add", "--detach", path, sha], stdout=subprocess.DEVNULL)
    return path


def fast_replay(url: str, read_ahead: int, tree: str | None = None) -> tuple[float, float]:
    """`keyfill replay` over the whole archive into a null sink (this tree's, or the worktree
    `tree`'s): records/s by its own summary, and peak RSS in MB."""
    cli = [sys.executable, "-m", "keyfill", "replay", url, "--read-ahead-bytes", str(read_ahead), "--json"]
    if tree:  # its own modules first: from its folder, on its path
        cli = ["env", "-C", tree, *cli]
    out, peak, _ = run_child(cli, {"PYTHONPATH": tree} if tree else None)
    summary = json.loads(out)
    return summary["records"] / summary["seconds"], peak


def compare_fast(url: str, budgets: list[int], rev: str) -> None:
    """The fast consumer of this tree against revision `rev`'s, alternating, best of 3 each."""
    tree = worktree(rev)
    fast_replay(url, budgets[0], tree)  # its first run compiles the worktree's kernels
    for ra in budgets:
        best = {"this tree": 0.0, rev: 0.0}
        for _ in range(3):
            for name in best:
                rate, _ = fast_replay(url, ra, None if name == "this tree" else tree)
                best[name] = max(best[name], rate)
        print(
            f"fast consumer at {ra // MiB} MiB, this tree / {rev}: {best['this tree']:,.0f} / {best[rev]:,.0f} "
            f"records/s = {best['this tree'] / best[rev]:.3f}x"
        )


def huge(args: argparse.Namespace) -> None:
    """The huge-piece shape: one key carries 60% of 18M records, all in one 1 h slice."""
    from bench.archives import cached_compacted
    from compactor.spark_session import local_spark
    from keygroups.storage import open_storage
    from tests.records import archive_metas

    spark = None

    def session():
        nonlocal spark
        if spark is None:
            spark = local_spark("local[2]", app="keyfill bench memory", progress=False, driver_memory="4g")
            spark.sparkContext.setLogLevel("ERROR")
        return spark

    root = args.dir + "-huge"
    records = 18_000_000
    url = cached_compacted(root, records, 64, "1h", session, seal_all=True, rate=10_000.0, hot_key_share=0.6)
    largest = max((p for m in archive_metas(open_storage(url)) for p in m.pieces), key=lambda p: p.length)
    ra = 64 * MiB
    print(f"\n{records:,} records, 64 groups, 1h slices, one key 60%: largest piece {largest.length / 1e6:,.0f} MB")
    head = f"{'row':<34} {'read-ahead':>10} {'records/s':>10} {'warm MB':>8} {'peak MB':>8} {'over warm':>10}"
    print(f"{head} {'goal':>6}")
    for label, pause in (("replay, slow consumer", 0.002), ("replay, fast consumer", 0.0)):
        child = [sys.executable, "-m", "bench.bench_memory", "--child", url, str(ra), str(records)]
        out, _, _ = run_child([*child, str(args.batch_size), str(pause)])
        r = json.loads(out.strip().splitlines()[-1])
        over = r["peak_mb"] - r["warm_mb"]
        print(
            f"{label:<34} {ra // MiB:>7} MiB {r['records'] / r['seconds']:>10,.0f} {r['warm_mb']:>8.0f} "
            f"{r['peak_mb']:>8.0f} {over:>10.0f} {ra // MiB + 192:>6}"
        )
    if not args.no_spark:
        import reader.spark as rs

        s = session()
        rs.register(s)
        t0 = time.perf_counter()
        rows, peak = spark_row(s, url, ra, args.batch_size, os.path.join(root, f"ck-{time.time_ns()}"))
        label = f"Spark, slow sink ({rows:,} rows)"
        print(f"{label:<34} {ra // MiB:>7} MiB {rows / (time.perf_counter() - t0):>10,.0f} {'':>8} {peak:>8.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dir", default="/tmp/keyfill-bench-memory", help="archive cache")
    ap.add_argument("--records-slow", type=int, default=None, help="records the slow replay consumer takes")
    ap.add_argument("--batch-size", type=int, default=10_000)
    ap.add_argument("--no-spark", action="store_true")
    ap.add_argument("--huge", action="store_true", help="a piece far larger than the read-ahead")
    ap.add_argument("--against", metavar="REV", help="also replay with git revision REV's CLI, alternating")
    child = ("URL", "READ_AHEAD", "RECORDS", "BATCH", "PAUSE")
    ap.add_argument("--child", nargs=5, metavar=child, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        url, ra, n, b, pause = args.child
        child_replay(url, int(ra), int(n), int(b), float(pause))
        return
    if args.huge:
        huge(args)
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
    allocators = {"mapped": {}, "left alone": {"KEYFILL_MMAP_THRESHOLD": "0"}}
    print(f"\n{records:,} records, 64 groups, {slices} slices, at {url}")
    print(
        f"{'row':<46} {'read-ahead':>10} {'records/s':>10} {'warm MB':>8} {'peak MB':>8} {'over warm':>10} "
        f"{'goal':>6} {'held MiB':>9}"
    )
    for ra in budgets:
        for name, env in allocators.items():
            child = [sys.executable, "-m", "bench.bench_memory", "--child", url, str(ra), str(slow_n)]
            out, _, _ = run_child([*child, str(args.batch_size), "0.002"], env)
            r = json.loads(out.strip().splitlines()[-1])
            label = f"replay, slow consumer, buffers {name}"
            over = r["peak_mb"] - r["warm_mb"]
            print(
                f"{label:<46} {ra // MiB:>7} MiB {r['records'] / r['seconds']:>10,.0f} {r['warm_mb']:>8.0f} "
                f"{r['peak_mb']:>8.0f} {over:>10.0f} {ra // MiB + 192:>6} {r['held'] / MiB:>9.1f}"
            )
    fast: dict[tuple[int, str], float] = {}
    peaks: dict[tuple[int, str], float] = {}
    cpu: dict[tuple[int, str], float] = {}
    for ra in budgets:
        for _ in range(3):  # alternating, best of 3
            for name, env in allocators.items():
                cli = [sys.executable, "-m", "keyfill", "replay", url, "--read-ahead-bytes", str(ra), "--json"]
                out, peak, seconds = run_child(cli, env)
                summary = json.loads(out)
                key = (ra, name)
                fast[key] = max(fast.get(key, 0.0), summary["records"] / summary["seconds"])
                peaks[key] = max(peaks.get(key, 0.0), peak)
                cpu[key] = min(cpu.get(key, seconds), seconds)
        for name in allocators:
            label = f"keyfill replay (fast, best of 3), {name}"
            print(
                f"{label:<46} {ra // MiB:>7} MiB {fast[ra, name]:>10,.0f} {'':>8} {peaks[ra, name]:>8.0f}"
                f"   CPU {cpu[ra, name]:.2f} s"
            )
    if args.against:
        compare_fast(url, budgets, args.against)
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
    small, large = budgets
    print(f"\nfast consumer, 64 MiB / 2 GiB read-ahead: {fast[small, 'mapped'] / fast[large, 'mapped']:.2f}x records/s")
    for ra in budgets:
        ratio, spent = fast[ra, "mapped"] / fast[ra, "left alone"], cpu[ra, "mapped"] / cpu[ra, "left alone"]
        print(
            f"fast consumer at {ra // MiB} MiB, buffers mapped / left alone: {ratio:.2f}x records/s, "
            f"{spent:.2f}x CPU seconds"
        )
    print(f"(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB peak)")


if __name__ == "__main__":
    main()
