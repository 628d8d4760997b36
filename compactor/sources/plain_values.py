"""Arrow's logical types as the plain values under them, as Kafka Connect's JSON shows a
value: `plain` casts a column (timestamps, durations, dates and times as their integers,
decimals as exact strings, UUIDs as text, dictionaries decoded, nested types field by
field); `UNIT_DIVISOR` is a timestamp unit's integers over milliseconds. Shared by the
kafka-connect format's Parquet reader and the iceberg format."""

from __future__ import annotations

import uuid

import pyarrow as pa

UNIT_DIVISOR = {"ms": 1, "us": 1_000, "ns": 1_000_000}


def plain(arr: pa.Array) -> pa.Array:
    """`arr` with logical types cast to the plain values the JSON text shows."""
    t = arr.type
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t) or pa.types.is_time64(t):
        return arr.cast(pa.int64())
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return arr.cast(pa.int32())
    if pa.types.is_decimal(t):
        return arr.cast(pa.string())
    if pa.types.is_dictionary(t):
        return plain(arr.cast(t.value_type))
    if isinstance(t, pa.ExtensionType) or getattr(t, "extension_name", None) == "arrow.uuid":  # canonical: no subclass
        if t.extension_name == "arrow.uuid":
            return pa.array([None if b is None else str(uuid.UUID(bytes=b)) for b in arr.storage.to_pylist()])
        return plain(arr.storage)
    if pa.types.is_struct(t):
        children = [plain(arr.field(i)) for i in range(t.num_fields)]
        return pa.StructArray.from_arrays(children, names=[f.name for f in t], mask=arr.is_null())
    if pa.types.is_map(t):
        return pa.MapArray.from_arrays(arr.offsets, plain(arr.keys), plain(arr.items), mask=arr.is_null())
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        cls = pa.ListArray if pa.types.is_list(t) else pa.LargeListArray
        return cls.from_arrays(arr.offsets, plain(arr.values), mask=arr.is_null())
    return arr
