"""`keyfill plan` (compactor.estimate): what it states as exact equals what the compaction
with the same options then makes, its estimates bound or come near the real figures, and it
writes nothing to the destination."""

from __future__ import annotations

import json
import os

import pytest

from compactor.estimate import estimate
from compactor.execution import for_session
from compactor.job import CompactConfig, analyse, compact, prepare
from keyfill.cli.plan import print_estimate
from keyfill.synth.generate import GeneratorConfig, generate


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    src = str(tmp_path_factory.mktemp("plan") / "src")
    generate(
        GeneratorConfig(out=src, records=30_000, keys=800, partitions=4, chunk_records=5_000, rate=2.0, seed=4),
        progress=False,
    )
    return src


@pytest.mark.parametrize("slice_duration", [None, "1m"])
def test_the_plan_matches_what_the_compaction_makes(spark, source, tmp_path, slice_duration, capsys):
    dest = str(tmp_path / "c")
    cfg = CompactConfig(source=source, dest=dest, groups=8, slice_duration=slice_duration)
    prepared = prepare(cfg, dry_run=True)
    e = estimate(prepared, analyse(prepared, for_session(spark), {}))
    assert not os.path.exists(dest) or not os.listdir(dest)  # a plan writes nothing, not even a lease

    result = compact(cfg, spark)
    assert (e.slices, e.empty_slices, e.records, e.held_back) == (
        result.slices,
        result.empty_slices,
        result.records,
        result.withheld,
    )
    assert e.keys == result.keys and e.groups == result.groups
    assert e.group_balance == pytest.approx(result.max_group_bytes / result.mean_group_bytes, rel=1e-6)
    assert result.pieces <= e.pieces  # at most one piece per group with records in a slice
    assert e.files == result.files
    assert 0.7 * result.file_bytes <= e.archive_bytes <= 1.3 * result.file_bytes
    assert e.derived == (slice_duration is None)
    if slice_duration:
        assert e.slice_duration == slice_duration
    assert e.micro_batches >= 1 and e.recommendations

    data = json.loads(json.dumps(e.to_json()))
    assert data["records"] == result.records and isinstance(data["recommendations"], list)
    print_estimate(e)
    text = capsys.readouterr().out
    assert f"{result.records:,} records published" in text and "nothing written" in text


def test_a_plan_recommends_the_derived_length_when_slices_are_short(spark, source, tmp_path):
    prepared = prepare(
        CompactConfig(source=source, dest=str(tmp_path / "c"), groups=64, slice_duration="1s"), dry_run=True
    )
    e = estimate(prepared, analyse(prepared, for_session(spark), {}))
    assert e.records / e.pieces < 50
    assert any("--slice-duration" in r for r in e.recommendations), e.recommendations
