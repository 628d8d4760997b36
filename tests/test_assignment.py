"""The key assignment's lookup (keygroups.assignment.KeyAssignment): per batch, the group of
every known key, MISSING for every unknown one, null keys by partition — equal to a plain
dictionary lookup, also when hashes collide (forced with a 2-bit hash)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keygroups import assignment as assignment_module
from keygroups.assignment import ASSIGNMENT_SCHEMA, MISSING, KeyAssignment
from keygroups.key_hash import hash_keys

keys_st = st.binary(min_size=0, max_size=6)


def table(known: dict[bytes, int], nulls: dict[int, int], buckets: list[int] = ()) -> pa.Table:
    rows = [{"key": k, "null_key_partition": None, "group": g, "records": 1, "bytes": 1} for k, g in known.items()]
    rows += [{"key": None, "null_key_partition": p, "group": g, "records": 1, "bytes": 1} for p, g in nulls.items()]
    rows += [{"group": g, "records": 1, "bytes": 1, "bucket": b, "keys": 1} for b, g in enumerate(buckets)]
    return pa.Table.from_pylist(rows[::-1], schema=ASSIGNMENT_SCHEMA)  # any row order


@pytest.mark.parametrize("weak", [False, True])
@settings(max_examples=300, deadline=None)
@given(
    known=st.dictionaries(keys_st, st.integers(0, 63), max_size=60),
    nulls=st.dictionaries(st.integers(0, 7), st.integers(0, 63), max_size=4),
    asked=st.lists(st.one_of(st.none(), keys_st), max_size=80),
    extra=st.lists(keys_st, max_size=20),
    slice_at=st.integers(0, 5),
    buckets=st.one_of(
        st.just([]), st.sampled_from([1, 4, 64]).flatmap(lambda n: st.lists(st.integers(0, 63), min_size=n, max_size=n))
    ),
)
def test_group_of_is_a_dictionary_lookup(weak, known, nulls, asked, extra, slice_at, buckets, monkeypatch_module):
    """With buckets: a key with an entry goes to its entry's group, any other to the group of
    bucket hash mod the bucket count."""
    if weak:  # every key shares its hash with a quarter of the others: the exact path for shared hashes
        monkeypatch_module.setattr(assignment_module, "hash_keys", lambda keys: hash_keys(keys) & np.uint64(3))
    else:
        monkeypatch_module.setattr(assignment_module, "hash_keys", hash_keys)
    lookup = KeyAssignment.from_table(table(known, nulls, buckets))

    def unknown(k: bytes) -> int:
        if not buckets:
            return MISSING
        return buckets[int(assignment_module.hash_keys(pa.array([k], pa.binary()))[0]) % len(buckets)]

    batch = [*asked, *known, *extra]
    parts = np.arange(len(batch), dtype=np.int32) % 8
    arr = pa.array(batch, pa.binary()).slice(min(slice_at, len(batch)))  # an offset into the buffers too
    parts = parts[min(slice_at, len(batch)) :]
    got = lookup.group_of(arr, parts)
    want = [
        (nulls.get(int(p), MISSING) if k is None else known[k] if k in known else unknown(k))
        for k, p in zip(arr.to_pylist(), parts.tolist())
    ]
    assert got.tolist() == want


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_hashes_spread_and_depend_on_every_byte():
    keys = pa.array([f"user-{i:08d}".encode() for i in range(200_000)])
    h = hash_keys(keys)
    assert len(np.unique(h)) == len(h)
    low = np.bincount((h & np.uint64(1023)).astype(np.int64), minlength=1024)
    chi2 = ((low - low.mean()) ** 2 / low.mean()).sum()
    assert chi2 < 1023 + 6 * (2 * 1023) ** 0.5  # low bits uniform on similar keys: chi-square, 1023 dof, 6 sigma
    assert hash_keys(pa.array([b"ab"]))[0] != hash_keys(pa.array([b"ba"]))[0]
    large = hash_keys(keys.cast(pa.large_binary()))
    assert np.array_equal(large, h)
    chunked = hash_keys(pa.chunked_array([keys.slice(0, 7), keys.slice(7)]))
    assert np.array_equal(chunked, h)


def test_the_cached_lookup_is_built_once_per_assignment_file(tmp_path, monkeypatch):
    """`cached_assignment` (the Spark source's live phase, per worker process) builds a lookup
    once, and another assignment file replaces it."""
    from keygroups.storage import open_storage

    store = open_storage(str(tmp_path))
    assignment_module.write_assignment(store, "a.parquet", table({b"k": 3}, {}))
    assignment_module.write_assignment(store, "b.parquet", table({b"k": 5}, {}))
    built = []
    original = KeyAssignment.from_table
    monkeypatch.setattr(KeyAssignment, "from_table", lambda t: built.append(t) or original(t))
    a = assignment_module.cached_assignment(store, "a.parquet")
    assert assignment_module.cached_assignment(store, "a.parquet") is a and len(built) == 1
    b = assignment_module.cached_assignment(store, "b.parquet")
    assert len(built) == 2 and b.group_of(pa.array([b"k"]), np.zeros(1, np.int32)).tolist() == [5]
    assert a.group_of(pa.array([b"k"]), np.zeros(1, np.int32)).tolist() == [3]
