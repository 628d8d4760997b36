"""How long keyfill.testing takes to report a bug: a user's test of two jobs with planted
order bugs, run as hypothesis runs it by default (explain phase and all), each search from a
fresh random seed until it reports its minimal topic. The baseline, in the same run: the
same test on a correct per-key job, 40 examples, which is what a green run costs.

    python -m bench.bench_kit_search [--searches 3]

Prints per search its time and the number of `check_job` calls (generation, shrinking and
explaining), and the median of each bug's searches over the baseline.
"""

from __future__ import annotations

import argparse
import statistics
import time

from hypothesis import HealthCheck, given, settings

from keyfill.testing import DifferentialError, backfill_settings, check_job, topic_archives


def running_totals(stream):
    """Correct: per key, the bytes of its values so far."""
    totals: dict = {}
    for r in stream:
        if r.key is not None:
            totals[r.key] = totals.get(r.key, 0) + len(r.value)
            yield r.key, totals[r.key]


def sequence_across_keys(stream):
    """Planted bug: a sequence number counted across keys."""
    for n, r in enumerate(stream, 1):
        yield r.key, n


def state_per_partition(stream):
    """Planted bug: state kept per Kafka partition, reported per key."""
    seen: dict = {}
    for r in stream:
        seen[r.partition] = seen.get(r.partition, 0) + 1
        yield r.key, seen[r.partition]


def search(job, examples: int) -> tuple[float, int, str | None]:
    """(seconds, check_job calls, the failure's first line or None) of one test run."""
    calls = [0]

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    @given(archive=topic_archives(), backfill=backfill_settings())
    def test(archive, backfill):
        calls[0] += 1
        check_job(job, archive, backfill)

    t = time.perf_counter()
    try:
        test()
        failure = None
    except DifferentialError as exc:
        failure = str(exc).splitlines()[0]
    except Exception as exc:  # noqa: BLE001 - e.g. hypothesis' FlakyFailure: reported as it is
        failure = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return time.perf_counter() - t, calls[0], failure


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--searches", type=int, default=3, help="searches per planted bug")
    args = p.parse_args(argv)
    base, base_calls, failure = search(running_totals, 40)
    assert failure is None, failure
    print(f"baseline, a correct job, 40 examples: {base:.1f} s, {base_calls} check_job calls")
    for job in (sequence_across_keys, state_per_partition):
        times = []
        for _ in range(args.searches):
            took, calls, failure = search(job, 60)
            if failure is None:
                print(f"  {job.__name__}: not caught in 60 examples ({took:.1f} s)")
                continue
            times.append(took)
            print(f"  {job.__name__}: {took:.1f} s, {calls} check_job calls: {failure}")
        if times:
            med = statistics.median(times)
            print(f"{job.__name__}: median {med:.1f} s, max {max(times):.1f} s = {med / base:.1f}x the baseline")


if __name__ == "__main__":
    main()
