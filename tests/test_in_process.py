"""The compaction run in this process (`compact(cfg, spark=None)`) against the same run on
Spark: the same bytes for a compaction, the same pieces for an append. (Random small
archives: tests/test_compactor.py::test_small_archives_keep_invariants_1_5_6.)"""

from __future__ import annotations

import pyarrow as pa
import pytest

from compactor.job import CompactConfig, compact
from compactor.sources import open_source
from compactor.verify import verify
from keyfill.synth.generate import GeneratorConfig, generate
from keygroups import compacted
from keygroups.assignment import assignment_keys, is_bucket, load_assignment
from keygroups.storage import open_storage
from tests.records import canonical_files, read_pieces
from tests.test_append import copy_share


def pieces_of(url: str) -> list[tuple]:
    """Every piece's slice, group and records (as Python rows), and the manifest's totals
    and hand-off: what an append must agree on, whatever its run ids."""
    rows = [(m.slice, p.group, pa.Table.from_batches([b]).to_pylist()) for m, p, b in read_pieces(open_storage(url))]
    m = compacted.load_manifest(open_storage(url))
    return [m.totals, m.handoff, m.slices, m.groups, rows]


def most_keys_in_a_chunk(url: str) -> int:
    source = open_source(url)
    return max(len(set(source.read(c).column("key").to_pylist())) for c in source.list_chunks())


@pytest.mark.parametrize("exact_keys", [None, 0, "chunk"], ids=["exact", "buckets", "more-than-any-chunk"])
def test_a_compaction_and_an_append_in_process_write_what_spark_writes(spark, tmp_path, exact_keys):
    """Also with the assignment in buckets (exact_keys=0: heavy keys exact, the rest by hash
    bucket), where an append's new keys go to their bucket's group; and with a limit that no
    chunk passes but the archive does (Spark's pass learns it from the keys it collects)."""
    full = str(tmp_path / "full")
    generate(
        GeneratorConfig(
            out=full, records=20_000, keys=500, partitions=4, chunk_records=1_500, headers=True, null_keys=0.05, seed=4
        ),
        progress=False,
    )
    if exact_keys == "chunk":
        exact_keys = most_keys_in_a_chunk(full)  # null keys count once per partition: the archive has more
    cfg = dict(source=full, groups=7, slice_duration="5s", target_file_bytes=64 << 10, exact_keys=exact_keys)
    on_spark, here = str(tmp_path / "spark"), str(tmp_path / "here")
    a = compact(CompactConfig(**cfg, dest=on_spark), spark)
    b = compact(CompactConfig(**cfg, dest=here))
    assert a.files > a.groups  # several files per group: the writer's cuts are compared too
    assert canonical_files(on_spark) == canonical_files(here)
    assert verify(open_source(full), open_storage(here)).ok
    table = load_assignment(open_storage(here), compacted.load_manifest(open_storage(here)).assignment)
    if exact_keys is not None:  # 7 groups: 2,048 buckets; heavy keys (above 1/448 of the bytes) and null keys exact
        assert int(is_bucket(table).sum()) == 2048 and 0 < int((~is_bucket(table)).sum()) < a.keys
        assert assignment_keys(table) == a.keys
    else:
        assert not is_bucket(table).any()

    src = str(tmp_path / "src")
    copy_share(full, src, 0.5)
    grown = dict(cfg, source=src)
    on_spark, here = str(tmp_path / "spark2"), str(tmp_path / "here2")
    compact(CompactConfig(**grown, dest=on_spark), spark)
    compact(CompactConfig(**grown, dest=here))
    copy_share(full, src, 1.0)
    a = compact(CompactConfig(**grown, dest=on_spark, append=True), spark)
    b = compact(CompactConfig(**grown, dest=here, append=True))
    assert (a.kind, b.kind) == ("append", "append") and a.new_records == b.new_records > 0
    assert pieces_of(on_spark) == pieces_of(here)
    assert verify(open_source(src), open_storage(here)).ok
