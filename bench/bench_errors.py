"""Time to a clear error, as an operator meets it: each probe runs the `keyfill` command in
a fresh process and is timed to its exit, against a baseline measured in the same run.

    python -m bench.bench_errors                   # 200K-record source (generated once)
    python -m bench.bench_errors --records 2000000

Baseline: `keyfill compact` of a one-chunk source, which pays what every run pays (Python
and Spark start-up, one Spark job reading one chunk). A corrupt chunk found inside a Spark
task should cost about that (start-up plus reading the chunk), whatever the size of the
rest of the source; the checks that need no Spark should cost a Python start-up.
Each probe also prints whether its last stderr line is keyfill's one-line error and
whether any traceback reached the terminal.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time


def run(argv: list[str], env: dict) -> tuple[float, int, str]:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    return time.perf_counter() - started, done.returncode, done.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--dir", default="/tmp/keyfill-bench-errors")
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()

    from bench.archives import cached_source
    from keyfill.synth.generate import GeneratorConfig

    src = cached_source(
        GeneratorConfig(
            out=os.path.join(args.dir, f"source-{args.records}"),
            records=args.records,
            keys=5_000,
            partitions=4,
            chunk_records=10_000,
            seed=3,
        )
    )
    chunks = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs if f.endswith(".avro"))
    work = os.path.join(args.dir, "work")
    shutil.rmtree(work, ignore_errors=True)
    one = os.path.join(work, "one")  # the baseline: a source of one chunk
    os.makedirs(os.path.dirname(os.path.join(one, os.path.relpath(chunks[0], src))))
    shutil.copy(chunks[0], os.path.join(one, os.path.relpath(chunks[0], src)))
    bad = os.path.join(work, "bad")  # the whole source, its last chunk cut short
    shutil.copytree(src, bad, ignore=shutil.ignore_patterns("_done"))
    victim = os.path.join(bad, os.path.relpath(chunks[-1], src))
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) // 2)

    keyfill = os.path.join(os.path.dirname(sys.executable), "keyfill")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    master = ["--master", args.master]
    base, rc, err = run([keyfill, "compact", one, os.path.join(work, "c0"), "--seal-all", *master], env)
    assert rc == 0, err
    probes = {
        "corrupt chunk (in a Spark task)": [keyfill, "compact", bad, os.path.join(work, "c1"), *master],
        "--groups out of range": [keyfill, "compact", src, os.path.join(work, "c2"), "--groups", "10000000", *master],
        "missing source": [keyfill, "compact", os.path.join(work, "nothing"), os.path.join(work, "c3"), *master],
        "replay --threads 100000": [keyfill, "replay", os.path.join(work, "c0"), "--threads", "100000"],
    }
    print(f"baseline: keyfill compact of one chunk ({os.path.basename(chunks[0])}): {base:.1f} s")
    print(f"{'probe':34} {'seconds':>8} {'x base':>7}  rc  one line  traceback")
    for name, argv in probes.items():
        seconds, rc, err = run(argv, env)
        lines = err.strip().splitlines()
        one_line = bool(lines) and lines[-1].startswith("keyfill ") and ": error: " in lines[-1]
        print(
            f"{name:34} {seconds:8.1f} {seconds / base:7.2f}  {rc:2d}  {'yes' if one_line else 'NO':8}  "
            f"{'YES' if 'Traceback' in err else 'no'}"
        )
        if lines:
            print(f"    {lines[-1][:150]}")


if __name__ == "__main__":
    main()
