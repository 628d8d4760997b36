"""CRC-32C of a run from its pieces' CRCs (keygroups.crc32c_combine): what a reader checks a
run of pieces against, so it must equal google-crc32c over the concatenated bytes."""

from __future__ import annotations

import google_crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from keygroups.crc32c_combine import combine


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=3000), min_size=1, max_size=12))
def test_combined_crcs_equal_the_crc_of_the_concatenation(parts):
    crcs = [google_crc32c.value(p) for p in parts]
    assert combine(crcs, [len(p) for p in parts]) == google_crc32c.value(b"".join(parts))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=500), min_size=2, max_size=6), st.data())
def test_one_changed_byte_changes_the_combined_crc(parts, data):
    """What the replay relies on: a changed byte anywhere in a run shows in the one check."""
    i = data.draw(st.integers(0, len(parts) - 1))
    j = data.draw(st.integers(0, len(parts[i]) - 1))
    damaged = bytearray(parts[i])
    damaged[j] ^= 1 << data.draw(st.integers(0, 7))
    whole = b"".join(parts[:i] + [bytes(damaged)] + parts[i + 1 :])
    assert combine([google_crc32c.value(p) for p in parts], [len(p) for p in parts]) != google_crc32c.value(whole)


def test_long_pieces():
    """A MiB-long piece, as long as a decode step: many squarings deep in the power table."""
    parts = [bytes(range(256)) * 4096, b"x" * 3, bytes(1 << 20)]
    assert combine([google_crc32c.value(p) for p in parts], [len(p) for p in parts]) == google_crc32c.value(
        b"".join(parts)
    )
