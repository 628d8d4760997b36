"""The compaction on a Spark Connect session against the same compaction on a classic one,
timed as users time them: the whole `keyfill compact` command, at its defaults but for the
options given below.

    python -m bench.bench_connect                     # 2M records, one run of each
    python -m bench.bench_connect --records 500000 --runs 2

- classic: `keyfill compact SRC DEST --master local[2]` (the embedded session: its JVM's
  start is part of the command);
- Connect: `keyfill compact SRC DEST --remote sc://127.0.0.1:<port>` against pyspark's own
  Connect server on `local[2]` with the embedded session's driver memory, started once
  before the runs, as a cluster's endpoint is (its start-up time is printed apart).

Runs alternate between the two; each compaction writes a fresh folder, and the two archives
of the first run are compared byte for byte (run ids aside). Also printed: the seconds the
compaction itself reports (no session start), and the same compaction run twice in one
session of each kind (`compactor.job.compact`, the second timed: both JVMs warm), which is
what the kind of session itself costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--slice-duration", default="1m")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--runs", type=int, default=1, help="runs of each, alternating")
    ap.add_argument("--dir", default="/tmp/keyfill-bench-connect")
    args = ap.parse_args()

    from bench.archives import cached_source
    from keyfill.synth.generate import GeneratorConfig
    from keyfill.testing.connect_server import start_connect_server
    from tests.records import canonical_files

    src = cached_source(
        GeneratorConfig(
            out=os.path.join(args.dir, f"source-{args.records}-{args.keys}-{args.partitions}"),
            records=args.records,
            keys=args.keys,
            partitions=args.partitions,
            chunk_records=250_000,
            headers=True,
            rate=2_000.0,
        )
    )
    t = time.perf_counter()
    server = start_connect_server(master=args.master, conf={"spark.driver.memory": "4g"})
    listening = time.perf_counter() - t
    query = "from pyspark.sql import SparkSession; SparkSession.builder.remote(%r).getOrCreate().range(9).collect()"
    subprocess.run([sys.executable, "-c", query % server.url], check=True, capture_output=True)
    answered = time.perf_counter() - t
    options = ["--groups", str(args.groups), "--slice-duration", args.slice_duration, "--seal-all", "--json"]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    env.pop("SPARK_REMOTE", None)
    kinds = {"classic": ["--master", args.master], "connect": ["--remote", server.url]}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    inner: dict[str, list[float]] = {k: [] for k in kinds}
    dests: dict[str, str] = {}
    with server:
        for run in range(args.runs):
            for kind, where in kinds.items() if run % 2 == 0 else reversed(kinds.items()):
                dest = os.path.join(args.dir, f"{kind}-{run}")
                shutil.rmtree(dest, ignore_errors=True)
                t = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, "-m", "keyfill", "-q", "compact", src, dest, *options, *where],
                    capture_output=True,
                    text=True,
                    env=env,
                )
                seconds = time.perf_counter() - t
                if done.returncode:
                    raise SystemExit(f"{kind}: exit {done.returncode}\n{done.stderr[-3000:]}")
                times[kind].append(seconds)
                inner[kind].append(json.loads(done.stdout)["seconds"])
                dests.setdefault(kind, dest)
                print(
                    f"run {run}: {kind:8} {seconds:6.1f} s (the compaction's own {inner[kind][-1]:.1f} s)", flush=True
                )
        warm = {k: _warm_twice(k, server.url, args, src) for k in kinds}
    equal = canonical_files(dests["classic"]) == canonical_files(dests["connect"])
    best = {k: min(v) for k, v in times.items()}
    own = {k: min(v) for k, v in inner.items()}
    print(f"\n{args.records:,} records, {args.keys:,} keys, {args.partitions} partitions; {args.groups} groups")
    print(f"Spark {args.master}; the Connect server listened {listening:.1f} s after start, answered {answered:.1f} s")
    print(f"{'':<28} {'command s':>10} {'compaction s':>13}")
    for k in kinds:
        print(f"{'keyfill compact, ' + k:<28} {best[k]:>10.1f} {own[k]:>13.1f}")
    print(f"Connect / classic: {best['connect'] / best['classic']:.2f}x the command, "
          f"{own['connect'] / own['classic']:.2f}x the compaction (best of {args.runs})")  # fmt: skip
    print(
        f"the second compaction in one warm session: classic {warm['classic']:.1f} s, connect {warm['connect']:.1f} s"
    )
    print(f"Connect / classic, warm: {warm['connect'] / warm['classic']:.2f}x")
    print(f"archives equal byte for byte (run ids aside): {'yes' if equal else 'NO'}")


def _warm_twice(kind: str, url: str, args: argparse.Namespace, src: str) -> float:
    """The seconds of the second of two compactions in one session of `kind`, in a process
    of its own (PySpark runs one kind of session per process)."""
    code = (
        "import sys; from bench.bench_connect import twice; "
        "print(twice(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]))"
    )
    where = args.master if kind == "classic" else url
    dest = os.path.join(args.dir, f"warm-{kind}")
    done = subprocess.run(
        [sys.executable, "-c", code, kind, where, src, dest, str(args.groups), args.slice_duration],
        capture_output=True,
        text=True,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable},
    )
    if done.returncode:
        raise SystemExit(f"{kind}, warm: exit {done.returncode}\n{done.stderr[-3000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def twice(kind: str, where: str, src: str, dest: str, groups: int, slice_duration: str) -> float:
    from compactor.job import CompactConfig, compact
    from compactor.spark_session import local_spark
    from keygroups.spark_kind import set_log_level

    remote = where if kind == "connect" else None
    spark = local_spark(where if remote is None else "local[*]", app="bench", progress=False, remote=remote)
    set_log_level(spark, "ERROR")
    seconds = []
    for _ in range(2):
        cfg = CompactConfig(source=src, dest=dest, groups=groups, slice_duration=slice_duration, seal_all=True)
        seconds.append(compact(dataclasses.replace(cfg, overwrite=True), spark).seconds)
    spark.stop()
    return seconds[-1]


if __name__ == "__main__":
    main()
