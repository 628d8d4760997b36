"""Small hand-made envelope batches for tests."""

from __future__ import annotations

from keygroups import envelope


def envelope_records(partition, offsets, ts, keys):
    """Records of one partition at these offsets, timestamps and keys; values name the offset."""
    return envelope.batch_from_records(
        [
            {
                "partition": partition,
                "offset": int(o),
                "timestamp": int(t),
                "key": k,
                "value": b"v%d" % o,
                "headers": [],
            }
            for o, t, k in zip(offsets, ts, keys)
        ]
    )
