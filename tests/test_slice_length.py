"""The slice length derived when --slice-duration is not given (compactor.slice_length): the
rule, stretches merged from the statistics pass's 1 m stretches equal to those cut at the chosen length
(a property), and a sparse archive of weeks compacted and replayed by the worked Spark job
with all defaults: few micro-batches, an archive about the source's size."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor import slice_length
from compactor.job import CompactConfig, compact
from compactor.slicing import ChunkStats, chunk_stretches
from keyfill.synth.generate import GeneratorConfig, generate
from keygroups import compacted
from keygroups.storage import open_storage


def test_the_rule_picks_the_shortest_length_with_enough_bytes_per_group():
    day = 86_400_000
    need = slice_length.MIN_PIECE_BYTES * 16
    assert slice_length.derive(need * 90 * 1440, 90 * day, 16) == "1m"  # busy: a slice a minute holds enough
    assert slice_length.derive(need * 90 * 24, 90 * day, 16) == "1h"
    assert slice_length.derive(need * 90 * 24 - 1, 90 * day, 16) == "2h"  # just short of an hour's worth
    assert slice_length.derive(1_000, 90 * day, 16) == slice_length.MAX_DERIVED  # sparse: capped
    assert slice_length.derive(need * 90 * 24, 90 * day, 64) == "6h"  # more groups, longer slices
    for label, ms in slice_length.LADDER.items():
        assert ms % slice_length.STATS_MS == 0, label


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(st.integers(0, 400_000), min_size=1, max_size=80),
    jitter=st.lists(st.integers(0, 90_000), min_size=80, max_size=80),
    label=st.sampled_from(list(slice_length.LADDER)),
)
def test_stretches_merged_from_one_minute_ones_are_those_cut_at_the_chosen_length(steps, jitter, label):
    ts = np.cumsum(steps) - np.array(jitter[: len(steps)]) + 1_700_000_000_000
    offsets = np.arange(100, 100 + len(ts))
    digests = lambda rows: [f"d{r}" for r in rows]  # noqa: E731 - which row each run ends at
    fine = ChunkStats("k", "t", 0, 100, int(offsets[-1]), len(ts), int(ts.min()), int(ts.max()), [])
    fine.stretches = chunk_stretches(offsets, ts, slice_length.STATS_MS, digests)
    (merged,) = slice_length.coarsen([fine], slice_length.LADDER[label])
    assert merged.stretches == chunk_stretches(offsets, ts, slice_length.LADDER[label], digests)


@pytest.fixture(scope="module")
def sparse(tmp_path_factory):
    """Four weeks of a topic at 0.031 records/s: what the 1 m default made a backfill of
    tens of thousands of micro-batches of."""
    src = str(tmp_path_factory.mktemp("sparse") / "src")
    generate(
        GeneratorConfig(out=src, records=75_000, keys=2_000, partitions=4, chunk_records=10_000, rate=0.031, seed=9),
        progress=False,
    )
    return src


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def test_a_sparse_archive_with_all_defaults_is_few_micro_batches_and_about_the_sources_size(spark, sparse, tmp_path):
    from jobs.fraud_backfill import job, parse_args

    url = str(tmp_path / "c")
    result = compact(CompactConfig(source=sparse, dest=url), spark)
    manifest = compacted.load_manifest(open_storage(url))
    assert manifest.config.slice_duration in slice_length.LADDER
    assert manifest.slice_duration_ms > 60_000  # longer than the old fixed 1 m
    assert folder_bytes(url) <= 1.5 * folder_bytes(sparse)
    assert result.slices < 100
    done = job(spark, parse_args([url, "--out", str(tmp_path / "fraud")]))
    assert done["records"] == manifest.totals.records and 1 <= done["batches"] <= 100
