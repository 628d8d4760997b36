"""`keyfill worker-python`: write the Python launcher for Spark's workers."""

from __future__ import annotations

import argparse
import os
import sys


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "worker-python",
        help="write a Python for Spark's workers that imports pyspark byte-compiled",
        description="Spark starts a streaming source's Python worker (and, on Spark Connect, a foreachBatch "
        "worker) with 10 s to connect back, and that worker first compiles pyspark from Spark's pyspark.zip: on "
        "a busy executor it can fail with 'Python worker failed to connect back'. This writes an executable "
        "to give Spark as its Python (PYSPARK_PYTHON, spark.pyspark.python) that imports an extracted, "
        "byte-compiled copy of the zips instead, cached per Spark version. Run it on every node, at the same "
        "path (an image build, a bootstrap action, an init script): docs/deploy.md says where each platform "
        "takes the setting.",
    )
    p.add_argument("path", help="where to write the launcher, e.g. /usr/local/bin/keyfill-python")
    p.add_argument("--python", default=sys.executable, help="the interpreter it runs (default: this one)")
    p.add_argument("--cache", help="where the compiled copies go (default: ~/.cache/keyfill/pyspark)")
    p.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    from keyfill.worker_python import imports_from, prime, spark_zips, write

    path = os.path.abspath(args.path)
    cache = write(path, args.python, args.cache)
    zips = spark_zips()
    if zips:
        prime(path, zips)  # this installation's pyspark: built now, not by the first worker
        found = imports_from(path, zips)
        if ".zip" in found:
            print(
                f"keyfill worker-python: warning: no compiled copy could be made in {cache}: {found}", file=sys.stderr
            )
    where = "~/.cache/keyfill/pyspark of the user Spark's workers run as" if "$" in cache else cache
    print(f"wrote {path} (compiled copies in {where}); give it to Spark as its Python:")
    print(f"  PYSPARK_PYTHON={path}   or   --conf spark.pyspark.python={path}")
    return 0
