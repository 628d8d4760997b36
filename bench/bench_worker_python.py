"""A new Python worker's start through `keyfill worker-python`'s launcher against Spark's own
(pyspark from `pyspark.zip`), timed as Spark pays it: a fresh interpreter that imports the
module a streaming source's worker runs.

    python -m bench.bench_worker_python              # 7 starts of each, alternating
    python -m bench.bench_worker_python --starts 15

Both run this interpreter with PYTHONPATH set as Spark sets it (its zips first); the launcher
is written to a scratch folder and its compiled copies built before the runs, as
`keyfill worker-python` builds them. Printed: median wall and CPU seconds per start, and the
launcher's over Spark's own. What the 10 s connect-back limit is measured against is the
start on a loaded machine: run it beside a load to see that.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from keyfill.worker_python import prime, spark_zips, write

# (Connect's worker modules exit when imported without Spark to talk to: not timed here)
MODULES = {"streaming source worker": "pyspark.sql.streaming.python_streaming_source_runner"}


def one_start(python: str, module: str, zips: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one interpreter that imports `module`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(zips)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run([python, "-c", f"import {module}"], env=env, check=True)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--starts", type=int, default=7, help="starts of each kind, alternating")
    args = p.parse_args(argv)
    zips = spark_zips()
    if not zips:
        print("this Python's pyspark has no zips to start from (a pip pyspark has them)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="keyfill-bench-worker-") as scratch:
        launcher = os.path.join(scratch, "keyfill-python")
        write(launcher, sys.executable, os.path.join(scratch, "cache"))
        prime(launcher, zips)
        print(f"{'worker':32} {'Spark (zip)':>18} {'launcher':>18} {'launcher / Spark':>20}")
        for label, module in MODULES.items():
            times: dict[str, list[tuple[float, float]]] = {"zip": [], "launcher": []}
            for _ in range(args.starts):
                times["zip"].append(one_start(sys.executable, module, zips))
                times["launcher"].append(one_start(launcher, module, zips))
            med = {
                k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()
            }
            zw, zc = med["zip"]
            lw, lc = med["launcher"]
            print(
                f"{label:32} {zw:6.2f} s {zc:5.2f} cpu {lw:6.2f} s {lc:5.2f} cpu "
                f"{lw / zw:8.2f}x wall {lc / zc:5.2f}x cpu"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
