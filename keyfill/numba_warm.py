"""Compile keyfill's numba kernels ahead of time: into this machine's numba cache
(`keyfill warm`, for an image or a bootstrap script), or into the seed a wheel ships
(`python -m keyfill.numba_warm seed`, run by `make wheel`; installed at import by
`keygroups._numba_seed`).

A kernel compiles for the argument types of its first call, so the only sure way to compile
what a task will call is to run the tasks: a small generated archive is compacted in this
process (the statistics, packing and rewrite a Spark job spreads over executors), verified,
read as a Spark task reads it (`reader.fetch.read_groups`), replayed, and split as Flink's
keyBy would; and a copy in Kafka Connect's layout is compacted too.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, TypedDict

PACKAGES = ("keyfill", "keygroups", "compactor", "reader", "jobs")


class Kernel(TypedDict):
    file: str  # the source file
    cache: str | None  # numba's cache folder of it (None: not cached)
    compiled: int  # signatures compiled in this process (cache misses)
    loaded: int  # signatures loaded from the cache (hits)


def kernels() -> dict[str, Kernel]:
    """Every numba kernel in keyfill's loaded modules: its source file, cache folder, and
    the signatures compiled (cache misses) and loaded (cache hits) in this process."""
    from numba.core.registry import CPUDispatcher

    found: dict[str, Kernel] = {}
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in PACKAGES:
            continue
        for value in list(vars(module).values()):
            if not isinstance(value, CPUDispatcher):
                continue
            if value.targetoptions.get("inline") == "always":
                continue  # compiled into the kernels that call it, never on its own
            cache = getattr(value, "_cache", None)
            found[f"{value.py_func.__module__}.{value.py_func.__qualname__}"] = {
                "file": value.py_func.__code__.co_filename,
                "cache": getattr(cache, "cache_path", None),
                "compiled": sum(value.stats.cache_misses.values()),
                "loaded": sum(value.stats.cache_hits.values()),
            }
    return found


def exercise_tasks(work: Path) -> int:
    """Generate, compact, read, replay and keyBy-split a small archive; the records replayed."""
    from compactor.job import CompactConfig, compact
    from compactor.sources import open_source
    from compactor.verify import verify
    from keyfill.synth.generate import GeneratorConfig, generate
    from keyfill.synth.topic import Record, TopicArchive, write_archive
    from keygroups import compacted
    from keygroups.piece_index import PieceIndex, piece_list
    from keygroups.storage import open_storage
    from reader import Records, replay
    from reader.fetch import read_groups
    from reader.flink_keyby import partition_batches

    source, archive = str(work / "source"), str(work / "compacted")
    generate(
        GeneratorConfig(out=source, records=20_000, keys=500, partitions=4, chunk_records=2_000, headers=True),
        progress=False,
    )
    compact(
        CompactConfig(
            source=source, dest=archive, groups=8, slice_duration="5s", target_file_bytes=64 << 10, seal_all=True
        )
    )
    store = open_storage(archive)
    verify(open_source(source), store)
    # Kafka Connect's S3 sink layout and broker log segments have decoders of their own
    topic = TopicArchive(
        "warm",
        tuple(
            tuple(
                Record(p, o, 1_000 * o, None if o % 7 == 0 else b"k%d" % (o % 13), b"v%d" % o, (("h", b"x"),))
                for o in range(300)
            )
            for p in range(2)
        ),
        chunk_records=100,
    )
    layouts = ["kafka-connect"]
    if importlib.util.find_spec("kafka") is not None:  # kafka-python writes the segments (the testing extra)
        layouts.append("kafka-segments")
    for layout in layouts:
        options = write_archive(topic, str(work / layout), layout)
        compact(CompactConfig(dest=str(work / f"{layout}-compacted"), groups=2, seal_all=True, **options))
    manifest = compacted.load_manifest(store)
    pieces = piece_list(PieceIndex.of(store, manifest).piece_rows(0, manifest.slices))
    pieces.sort(key=lambda p: (p.group, p.slice))
    for headers in (True, False):  # the Spark source drops headers unless a query has the column
        for _ in read_groups(store, pieces, read_ahead_bytes=64 << 20, range_bytes=8 << 20, headers=headers):
            pass
    replayed = 0
    with replay(archive, threads=4) as events:
        for event in events:
            if isinstance(event, Records):
                replayed += event.batch.num_rows
                for key_type in ("string", "bytes"):
                    partition_batches(event.batch, 4, key_type=key_type)
    return replayed


def warm() -> dict[str, Kernel]:
    """Run the tasks in this process, in a scratch folder; the kernels afterwards."""
    with tempfile.TemporaryDirectory(prefix="keyfill-warm-") as work:
        exercise_tasks(Path(work))
    return kernels()


def _files(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.suffix in (".nbi", ".nbc"))


def build_seed(code: Path, out: Path | None = None) -> dict[str, Any]:
    """Compile every kernel of the packages under `code` for the generic CPU, in a fresh
    process with an empty cache, and write the cache files and `seed.json` to `out`
    (default: `code`/keygroups/_numba_cache, where the wheel picks them up)."""
    from keygroups import _numba_seed

    out = out or code / "keygroups" / "_numba_cache"
    with tempfile.TemporaryDirectory(prefix="keyfill-seed-") as scratch:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "NUMBA_CACHE_DIR": str(Path(scratch) / "cache"),
            "NUMBA_CPU_NAME": _numba_seed.CPU,
            "KEYFILL_NUMBA_SEED": "0",  # compile everything, whatever seed the tree holds
        }
        env.pop("NUMBA_CPU_FEATURES", None)
        proc = subprocess.run(
            [sys.executable, "-m", "keyfill.numba_warm", "--child"],
            env=env,
            cwd=scratch,
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            raise RuntimeError(f"compiling the kernels failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        found: dict[str, Kernel] = json.loads(proc.stdout.splitlines()[-1])
        dirs: dict[str, list[str]] = {}
        shutil.rmtree(out, ignore_errors=True)
        for info in found.values():
            code_dir = Path(info["file"]).resolve().parent
            rel = code_dir.relative_to(code.resolve()).as_posix()
            if rel in dirs or not info["cache"]:
                continue
            names = _files(Path(info["cache"]))
            if not names:  # only kernels the tasks do not call (a source format's decoder)
                continue
            dirs[rel] = names
            cache = Path(info["cache"])
            (out / rel).mkdir(parents=True, exist_ok=True)
            for name in dirs[rel]:
                shutil.copyfile(cache / name, out / rel / name)
    digest = hashlib.sha256()
    for rel, names in sorted(dirs.items()):
        for name in names:
            digest.update(f"{rel}/{name}\0".encode() + (out / rel / name).read_bytes())
    manifest = {
        **_numba_seed.target(),
        "digest": digest.hexdigest()[:16],
        "dirs": dirs,
        "kernels": sorted(k for k, v in found.items() if v["compiled"]),
        "not_compiled": sorted(k for k, v in found.items() if not v["compiled"]),
    }
    (out / _numba_seed.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", nargs="?", choices=["seed"], help="seed: build the seed a wheel ships")
    ap.add_argument("--code", default=".", help="seed: the folder the packages are in (default: .)")
    ap.add_argument("--out", help="seed: where to write it (default: CODE/keygroups/_numba_cache)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:  # the fresh process of build_seed
        found = warm()
        print(json.dumps(found))
        return 0
    if args.command != "seed":
        ap.error("say what to build: seed")
    manifest = build_seed(Path(args.code), Path(args.out) if args.out else None)
    files = sum(len(v) for v in manifest["dirs"].values())
    print(
        f"seed for numba {manifest['numba']}, {manifest['python']}, {manifest['machine']} ({manifest['cpu']} CPU): "
        f"{len(manifest['kernels'])} kernels in {files} files; not compiled by the tasks: "
        + (", ".join(manifest["not_compiled"]) or "none")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
