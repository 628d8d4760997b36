"""The manifest is typed in memory (int partitions, dataclasses for its totals, settings,
source and last records) and JSON only at the edge: a version file read and written back is
the same bytes, so content ids and the determinism tests do not move."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compactor.job import CompactConfig, compact
from keyfill.synth.generate import GeneratorConfig, generate
from keygroups import compacted
from keygroups.errors import FormatError
from keygroups.manifest import LastRecord, Manifest
from keygroups.storage import open_storage
from tests.test_reader import hypothesis_settings


@pytest.fixture(scope="module")
def grown(tmp_path_factory) -> str:
    """An archive of 12 partitions (so string and numeric order of their keys differ),
    compacted from part of its source and then appended to: version 1 and version 2."""
    root = tmp_path_factory.mktemp("manifest")
    src, dest = str(root / "src"), str(root / "dest")
    generate(
        GeneratorConfig(out=src, records=24_000, keys=300, partitions=12, chunk_records=500, rate=400.0, seed=3),
        progress=False,
    )
    chunks = [sorted(d.glob("*.avro")) for d in Path(src, "payments").iterdir()]
    later = [c[-1] for c in chunks if len(c) > 1]
    for f in later:
        f.rename(f.with_suffix(".later"))
    compact(CompactConfig(src, dest, groups=4, slice_duration="5s", idle_after="2s"))
    for f in later:
        f.with_suffix(".later").rename(f)
    compact(CompactConfig(src, dest, append=True, seal_all=True))
    return dest


def test_a_version_file_read_and_written_back_is_the_same_bytes(grown):
    store = open_storage(grown)
    assert compacted.versions(store) == [1, 2]
    for version in (1, 2):
        raw = store.read(compacted.version_key(version))
        m = compacted.load_manifest(store, version)
        assert compacted.dumps(m.to_json()) == raw
        assert sorted(m.handoff) == list(range(12)) and all(type(p) is int for p in m.last_records)
        assert isinstance(m.last_records[11], LastRecord) and m.totals.records == sum(m.group_records)


def test_the_content_id_is_that_of_the_bytes_on_disk(grown):
    """The id an archive is known by (`archive`) hashes the JSON form, not the objects."""
    m = compacted.load_manifest(open_storage(grown), 1)
    assert compacted.content_id(m) == m.archive


@hypothesis_settings(200)
@given(
    st.dictionaries(st.integers(0, 2_000), st.integers(0, 2**62), max_size=40),
    st.dictionaries(st.integers(0, 2_000), st.tuples(st.integers(0, 2**40), st.integers(0, 2**44)), max_size=40),
)
def test_partition_maps_round_trip_whatever_their_partitions(grown, handoff, last):
    base = compacted.load_manifest(open_storage(grown), 2)
    m = dataclasses.replace(
        base,
        handoff=handoff,
        running_max=dict(handoff),
        held_back={p: o % 1000 for p, o in handoff.items()},
        last_records={p: LastRecord(o, t, f"{p:032x}") for p, (o, t) in last.items()},
    )
    raw = compacted.dumps(m.to_json())
    on_disk = json.loads(raw)
    assert list(on_disk["handoff"]) == sorted(map(str, handoff))  # keys as JSON strings, in string order
    again = Manifest.from_json(on_disk)
    assert again == m and compacted.dumps(again.to_json()) == raw


@pytest.mark.parametrize("partition", ["x", "-1", "1.0", ""])
def test_a_partition_that_is_not_a_whole_number_is_refused_naming_the_field(grown, tmp_path, partition):
    copy = tmp_path / "copy"
    shutil.copytree(grown, copy)
    store = open_storage(str(copy))
    doc = json.loads(store.read(compacted.version_key(2)))
    doc["running_max"][partition] = 5
    store.write(compacted.version_key(2), compacted.dumps(doc))
    with pytest.raises(FormatError, match=r"_versions/0+2\.json: running_max names a partition"):
        compacted.load_manifest(store)
