"""`keyfill warm`: compile numba's kernels now, into this machine's cache."""

from __future__ import annotations

import argparse
import time


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "warm",
        help="compile keyfill's numba kernels into this machine's cache (for an image build)",
        description="Run a small compaction, verify, read and replay so that numba compiles every kernel keyfill "
        "calls and caches it: a process started later (a Spark executor's Python worker) loads them instead of "
        "compiling them on its first task (seconds, see docs/deploy.md). Run it where the cluster's Python runs, "
        "e.g. in the image build. A wheel from `make wheel` needs none of this: it ships its kernels compiled.",
    )
    p.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    from keyfill.numba_warm import warm

    t = time.perf_counter()
    found = warm()
    compiled = sum(1 for v in found.values() if v["compiled"])
    loaded = sum(1 for v in found.values() if v["loaded"])
    folders = sorted({v["cache"] for v in found.values() if v["cache"]})
    where = folders[0] + (f" and {len(folders) - 1} more folders" if len(folders) > 1 else "") if folders else "-"
    print(
        f"{len(found)} kernels: {compiled} compiled, {loaded} loaded from the cache, "
        f"in {time.perf_counter() - t:.1f} s; cached under {where}"
    )
    return 0
