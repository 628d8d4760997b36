"""Synthetic archives for the benchmarks, generated and compacted once and cached."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def cached_source(config, *, progress: bool = False) -> str:
    """The source archive `config` (a GeneratorConfig) describes, generated into `config.out`
    unless a complete one is there (marked by `_done`)."""
    from keyfill.synth.generate import generate

    if not Path(config.out, "_done").exists():
        shutil.rmtree(config.out, ignore_errors=True)
        print(f"generating {config.records:,} records over {config.keys:,} keys in {config.out} ...", flush=True)
        generate(config, progress=progress)
        Path(config.out, "_done").touch()
    return config.out


def cached_compacted(
    root: str,
    records: int,
    groups: int,
    slice_duration: str | None,
    spark_factory,
    *,
    chunk_records: int = 250_000,
    seal_all: bool = False,
    keys: int = 100_000,
    partitions: int = 4,
    rate: float = 2_000.0,
    hot_key_share: float | None = None,
) -> str:
    """A compacted payments archive of `records` records under `root` (reused when it is
    complete); `spark_factory()` is called only when it must be compacted. `seal_all`: every
    slice published (with slices longer than the archive's span, none would be otherwise).
    `slice_duration` None: the compactor derives it, as `keyfill compact` does by default.
    `hot_key_share`: one key carries that share of the records."""
    from compactor.job import CompactConfig, compact
    from keyfill.synth.generate import GeneratorConfig, generate

    tag = f"{records}-{groups}-{slice_duration or 'derived'}" + ("-sealed" if seal_all else "")
    if (keys, partitions, rate) != (100_000, 4, 2_000.0):
        tag += f"-{keys}k-{partitions}p-{rate:g}r"
    if hot_key_share is not None:
        tag += f"-hot{hot_key_share:g}"
    src, dest = os.path.join(root, f"source-{tag}"), os.path.join(root, f"compacted-{tag}")
    if not os.path.exists(os.path.join(dest, "_done")):
        shutil.rmtree(root, ignore_errors=True)
        print(f"generating {records:,} records ...", flush=True)
        config = GeneratorConfig(
            out=src,
            records=records,
            keys=keys,
            partitions=partitions,
            chunk_records=chunk_records,
            headers=True,
            rate=rate,
            hot_key_share=hot_key_share,
        )
        generate(config, progress=False)
        print("compacting ...", flush=True)
        spark = spark_factory()
        config = CompactConfig(source=src, dest=dest, groups=groups, slice_duration=slice_duration, seal_all=seal_all)
        compact(config, spark)
        Path(dest, "_done").touch()
    return dest
