"""What numba costs a fresh executor's first task: compile (empty cache) against load (warm cache).

    python -m bench.bench_cold_start                 # 3 repeats, medians
    python -m bench.bench_cold_start --repeats 5 --records 50000

Every measured run is a fresh Python process (`--child`), as a Spark executor's first Python
worker is. Three kinds of task, each in processes of its own, so that none finds kernels another
compiled:

- compaction: `compactor.job.compact(cfg, spark=None)` of a small generated source, which
  runs in this one process what Spark spreads over executors and driver: the statistics
  task (source decode, key hashing), the driver's packing (keygroups.packing), and the
  rewrite's decode and write tasks (key lookup, record encoding, segment framing, snappy);
- read: what a `format("keyfill")` task runs on an executor (`KeyfillStreamReader.read`):
  `reader.fetch.read_groups` over every piece of the archive (PieceFetcher, piece checks
  with CRC-32C combining, snappy, the envelope decoder); the pieces are listed from the
  index before the clock starts, as the driver plans them;
- replay: `reader.replay` of the archive to its last record, in one process: the same
  reading plus the planning (`keygroups.assign_threads`: the packing kernels).

Cold: NUMBA_CACHE_DIR is a new empty folder. numba then uses its UserProvidedCacheLocator
(first in `CacheImpl._locator_classes`) and never looks at the in-tree `__pycache__/*.nbi`
files; the child checks that every keyfill kernel's cache path lies under NUMBA_CACHE_DIR.
Warm: a second process with the same folder. Seeded: a third process with an empty folder of
its own, from a snapshot that holds the seed a wheel ships (`make wheel`,
`keygroups._numba_seed`): what a fresh executor pays with keyfill installed from that wheel.
Cold and warm run with KEYFILL_NUMBA_SEED=0. The difference of cold and warm is numba's compile cost; the
kernels compiled and loaded are counted from each dispatcher's `stats` (cache misses and
hits per signature), and the `.nbi`/`.nbc` files in the folder after the cold run.

The source and the reader's archive are generated and compacted once beforehand, by a
process with a cache folder of its own (the generator's kernels are not the tasks' kernels).
The children run from a copy of the packages taken at the start (without `__pycache__`,
byte-compiled once): a snapshot that edits to the working tree during the run do not reach,
and that holds no in-tree numba cache. `--in-place` runs the working tree instead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from keyfill.numba_warm import PACKAGES, kernels

ROOT = Path(__file__).resolve().parent.parent

# --- the child: one task kind in a fresh process ---------------------------------------------


def _child(task: str, src: str, dest: str) -> None:
    t0 = time.perf_counter()
    out: dict = {}

    def lap(name: str) -> None:
        nonlocal t0
        now = time.perf_counter()
        out[name] = now - t0
        t0 = now

    import numpy  # noqa: F401
    import pyarrow  # noqa: F401

    lap("import numpy+pyarrow")
    import numba  # noqa: F401

    lap("import numba")
    if task == "compact":
        from compactor.job import CompactConfig, compact

        lap("import keyfill")
        cfg = CompactConfig(
            source=src, dest=dest, groups=8, slice_duration="5s", target_file_bytes=64 << 10, seal_all=True
        )
        result = compact(cfg)
        lap("compaction")
        for phase in ("statistics", "packing", "rewrite", "commit"):
            out[f"  {phase}"] = result.phases.get(phase, 0.0)
        out["records"] = result.records
    elif task == "read":
        from keygroups import compacted
        from keygroups.piece_index import PieceIndex, piece_list
        from keygroups.storage import open_storage
        from reader.fetch import read_groups

        lap("import keyfill")
        store = open_storage(dest)
        manifest = compacted.load_manifest(store)
        pieces = piece_list(PieceIndex.of(store, manifest).piece_rows(0, manifest.slices))
        pieces.sort(key=lambda p: (p.group, p.slice))  # group by group, each in slice order (GroupsPartition)
        lap("  plan (untimed)")
        n = 0
        for _step, batch in read_groups(store, pieces, read_ahead_bytes=64 << 20, range_bytes=8 << 20):
            if not n:
                lap("  first batch")
            n += batch.num_rows
        lap("  rest")
        out["read"] = out["  first batch"] + out["  rest"]
        out["records"] = n
    else:
        import reader

        reader.Replay  # noqa: B018  (loads reader.lockstep and what it imports)
        lap("import keyfill")
        n = 0
        with reader.replay(dest, threads=4) as events:
            for ev in events:
                if isinstance(ev, reader.Records):
                    if not n:
                        lap("  first batch")
                    n += ev.batch.num_rows
        lap("  rest")
        out["replay"] = out["  first batch"] + out["  rest"]
        out["records"] = n
    out["kernels"] = kernels()
    out["code"] = os.path.dirname(os.path.dirname(sys.modules["keygroups"].__file__))
    print("RESULT " + json.dumps(out))


# --- the parent --------------------------------------------------------------------------------


TREE = ROOT  # where the children import keyfill from (`snapshot` replaces it)


def snapshot(work: Path) -> Path:
    """The packages and this module copied to `work/code`, without caches, byte-compiled."""
    code = work / "code"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, code / package, ignore=skip)
    (code / "bench").mkdir()
    for name in ("__init__.py", "bench_cold_start.py"):
        shutil.copy2(ROOT / "bench" / name, code / "bench" / name)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(code)], check=True)
    return code


def _env(cache_dir: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["NUMBA_CACHE_DIR"] = cache_dir
    env["PYTHONPATH"] = str(TREE) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def run_child(task: str, src: str, dest: str, cache_dir: str, extra: dict[str, str] | None = None) -> dict:
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.bench_cold_start", "--child", task, "--src", src, "--dest", dest],
        env=_env(cache_dir, extra),
        cwd=TREE,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t
    if proc.returncode:
        raise RuntimeError(f"child {task} failed:\n{proc.stdout}\n{proc.stderr}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    result["process wall"] = wall
    found = result["kernels"]
    if result["code"] != str(TREE):
        raise RuntimeError(f"child imported keyfill from {result['code']}, not {TREE}")
    outside = [k for k, v in found.items() if v["cache"] and not v["cache"].startswith(cache_dir)]
    if outside:
        raise RuntimeError(f"kernels cached outside NUMBA_CACHE_DIR {cache_dir}: {outside[:3]}")
    result["compiled"] = sum(1 for v in found.values() if v["compiled"])
    result["loaded"] = sum(1 for v in found.values() if v["loaded"])
    return result


def cache_files(cache_dir: str) -> tuple[int, int, int]:
    """(.nbi files, .nbc files, bytes of both) under `cache_dir`."""
    nbi = nbc = size = 0
    for path in Path(cache_dir).rglob("*"):
        if path.suffix in (".nbi", ".nbc"):
            nbi += path.suffix == ".nbi"
            nbc += path.suffix == ".nbc"
            size += path.stat().st_size
    return nbi, nbc, size


def prepare(work: Path, records: int) -> tuple[str, str]:
    """The source and a compaction of it, made once by a process with its own numba cache."""
    src, archive = str(work / "source"), str(work / "compacted")
    code = (
        "from keyfill.synth.generate import GeneratorConfig, generate\n"
        "from compactor.job import CompactConfig, compact\n"
        f"generate(GeneratorConfig(out={src!r}, records={records}, keys=500, partitions=4, chunk_records=2_000,"
        " headers=True, null_keys=0.05, seed=4), progress=False)\n"
        f"compact(CompactConfig(source={src!r}, dest={archive!r}, groups=8, slice_duration='5s',"
        " target_file_bytes=64 << 10, seal_all=True))\n"
    )
    subprocess.run([sys.executable, "-c", code], env=_env(str(work / "setup-cache")), cwd=TREE, check=True)
    return src, archive


def numba_import_alone(repeats: int) -> tuple[float, float]:
    """Median seconds of `import numba` in a fresh process (after numpy), and of the bare
    interpreter's start."""
    code = "import time,numpy;t=time.perf_counter();import numba;print(time.perf_counter()-t)"
    alone, bare = [], []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        alone.append(float(out.stdout))
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare.append(time.perf_counter() - t)
    return statistics.median(alone), statistics.median(bare)


ROWS = {
    "compact": [
        "import numpy+pyarrow",
        "import numba",
        "import keyfill",
        "compaction",
        "  statistics",
        "  packing",
        "  rewrite",
        "  commit",
        "process wall",
    ],
    "read": ["import numpy+pyarrow", "import numba", "import keyfill", "read", "  first batch", "process wall"],
    "replay": ["import numpy+pyarrow", "import numba", "import keyfill", "replay", "  first batch", "process wall"],
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="cold+warm pairs per task (medians reported)")
    ap.add_argument("--records", type=int, default=20_000, help="records in the generated source")
    ap.add_argument("--dir", help="scratch folder (default: a new temporary one, removed at the end)")
    ap.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the measured processes, e.g. NUMBA_CPU_NAME=generic",
    )
    ap.add_argument("--in-place", action="store_true", help="run the working tree, not a snapshot of it")
    ap.add_argument("--child", choices=list(ROWS), help=argparse.SUPPRESS)
    ap.add_argument("--src", help=argparse.SUPPRESS)
    ap.add_argument("--dest", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.src, args.dest)
        return

    extra = dict(x.split("=", 1) for x in args.env)
    work = Path(args.dir or tempfile.mkdtemp(prefix="keyfill-cold-"))
    work.mkdir(parents=True, exist_ok=True)
    global TREE
    try:
        if not args.in_place:
            TREE = snapshot(work)
        t = time.perf_counter()
        src, archive = prepare(work, args.records)
        print(f"source and archive ready ({time.perf_counter() - t:.1f} s); {args.repeats} cold/warm pairs per task")
        numba_alone, bare = numba_import_alone(max(args.repeats, 3))
        states = ("cold", "warm") if args.in_place else ("cold", "warm", "seeded")
        if "seeded" in states:
            from keyfill.numba_warm import build_seed

            t = time.perf_counter()
            seed = build_seed(TREE)
            print(f"seed built in {time.perf_counter() - t:.1f} s: {len(seed['kernels'])} kernels, generic CPU")
        runs: dict[str, dict[str, list[dict]]] = {task: {state: [] for state in states} for task in ROWS}
        files: dict[str, list[tuple[int, int, int]]] = {task: [] for task in ROWS}
        for i in range(args.repeats):
            for task in ROWS:  # alternate the tasks so that a busy minute on the box hits both
                cache = str(work / f"cache-{task}-{i}")
                os.makedirs(cache)
                for state in states:
                    dest = str(work / f"out-{task}-{i}-{state}") if task == "compact" else archive
                    env = {**extra, "KEYFILL_NUMBA_SEED": "0"}
                    if state == "seeded":  # a fresh cache of its own, filled from the seed at import
                        env, cache = extra, str(work / f"cache-{task}-{i}-seeded")
                    result = run_child(task, src, dest, cache, env)
                    runs[task][state].append(result)
                    print(
                        f"  {task:8s} {state}  {result['process wall']:6.2f} s wall, "
                        f"{result['compiled']} kernels compiled, {result['loaded']} loaded",
                        flush=True,
                    )
                    if state == "cold":
                        files[task].append(cache_files(cache))
        print()
        print(f"bare interpreter start {bare:.3f} s; `import numba` alone (after numpy) {numba_alone:.3f} s")
        if extra:
            print(f"extra environment: {extra}")
        print()
        med = statistics.median
        header = f"{'task':8s} {'phase':22s} {'cold s':>8s} {'warm s':>8s} {'numba s':>8s} {'seeded s':>9s}"
        print(header)
        print("-" * len(header))
        for task, rows in ROWS.items():
            for row in rows:
                cold = med(r.get(row, 0.0) for r in runs[task]["cold"])
                warm = med(r.get(row, 0.0) for r in runs[task]["warm"])
                seeded = f"{med(r.get(row, 0.0) for r in runs[task]['seeded']):9.2f}" if "seeded" in states else ""
                print(f"{task:8s} {row:22s} {cold:8.2f} {warm:8.2f} {cold - warm:8.2f} {seeded}")
            cold_runs, warm_runs = runs[task]["cold"], runs[task]["warm"]
            nbi, nbc, size = files[task][0]
            print(
                f"{task:8s} kernels: compiled cold {med(r['compiled'] for r in cold_runs):.0f} "
                f"(warm {med(r['compiled'] for r in warm_runs):.0f}), loaded warm "
                f"{med(r['loaded'] for r in warm_runs):.0f}; cache after cold run: {nbi} .nbi, {nbc} .nbc, "
                f"{size / 1e6:.2f} MB; records {cold_runs[0]['records']:,}"
            )
            if "seeded" in states:
                seeded_runs = runs[task]["seeded"]
                print(
                    f"{task:8s} seeded (empty cache, the wheel's seed): compiled "
                    f"{med(r['compiled'] for r in seeded_runs):.0f}, loaded {med(r['loaded'] for r in seeded_runs):.0f}"
                )
            print()
        compiled = {t: {k for k, v in runs[t]["cold"][0]["kernels"].items() if v["compiled"]} for t in ROWS}
        used = sorted(set().union(*compiled.values()))
        print(f"distinct kernels compiled by any task: {len(used)}  (C: compact, R: read, P: replay)")
        for k in used:
            marks = "".join(mark if k in compiled[t] else "." for t, mark in zip(ROWS, "CRP"))
            print(f"  {marks} {k}")
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
