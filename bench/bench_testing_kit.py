"""What keyfill.testing's differential check costs: 50 examples on a plain Python job, and
the same examples' compactions on Spark (the baseline: how the kit would run without the
in-process compaction), in one run.

    python -m bench.bench_testing_kit [--examples 50] [--no-spark]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from hypothesis import HealthCheck, given, settings

from keyfill.testing import backfill_settings, check_job, topic_archives


def per_key_count(stream):
    seen: dict = {}
    for r in stream:
        k = r.key if r.key is not None else ("no key", r.partition)
        seen[k] = seen.get(k, 0) + 1
        yield k, seen[k]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=50)
    p.add_argument("--no-spark", action="store_true", help="skip the Spark baseline")
    args = p.parse_args(argv)
    cases, records = [], [0]

    @settings(max_examples=args.examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(archive=topic_archives(), backfill=backfill_settings())
    def run(archive, backfill):
        cases.append((archive, backfill))
        records[0] += check_job(per_key_count, archive, backfill).records

    t = time.perf_counter()
    run()
    kit = time.perf_counter() - t
    each = kit / len(cases)
    print(f"keyfill.testing: {len(cases)} examples, {records[0]:,} records compared, {kit:.1f} s ({each:.2f} s each)")
    if args.no_spark:
        return
    from compactor.errors import SlicingError
    from compactor.job import CompactConfig, compact
    from compactor.spark_session import local_spark
    from keyfill.testing import write_archive

    spark = local_spark("local[2]", app="bench-testing-kit", driver_memory="2g", progress=False)
    spark.sparkContext.setLogLevel("ERROR")
    compact_ms = {"spark": 0.0, "in process": 0.0}
    for archive, backfill in cases:
        if not archive.records:
            continue
        for engine, session in (("spark", spark), ("in process", None)):
            root = tempfile.mkdtemp()
            cfg = dict(write_archive(archive, root + "/src", backfill.layout), dest=root + "/c", groups=backfill.groups)
            cfg.update(slice_duration=backfill.slice_duration, seal_all=True, codec="null")
            t = time.perf_counter()
            try:
                compact(CompactConfig(**cfg), session)
            except SlicingError:
                pass
            compact_ms[engine] += time.perf_counter() - t
    spark.stop()
    s, h = compact_ms["spark"], compact_ms["in process"]
    print(f"compactions of the same examples: on Spark local[2] {s:.1f} s, in process {h:.1f} s ({s / h:.0f}x)")
    print(f"the check with Spark compactions would take ~{kit - h + s:.1f} s ({(kit - h + s) / kit:.1f}x the kit's)")


if __name__ == "__main__":
    main()
