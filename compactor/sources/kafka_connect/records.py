"""What every Kafka Connect file format's value decoder hands back (`Values`), and the rule
that turns its timestamps into the envelope's milliseconds; shared by the Avro, JSON and
Parquet readers so the three derive a record the same way."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from keygroups.envelope import CorruptFile


@dataclass(frozen=True)
class Values:
    """One value file decoded. `values` is binary, null for tombstones; `timestamps` the
    timestamp field's raw integers (null for tombstones), `divisor` their unit over
    milliseconds; `field_keys` the key field's keys when one was asked for."""

    values: pa.Array
    timestamps: pa.Array
    divisor: int
    field_keys: pa.Array | None = None

    def __len__(self) -> int:
        return len(self.values)


def timestamps_ms(v: Values, name: str, first: int, field: str) -> np.ndarray:
    """Epoch milliseconds per record (floored). A tombstone takes the timestamp of the record
    before it in the file, or after it when it leads: the files keep no Kafka timestamps."""
    n = len(v)
    is_value = v.values.is_valid().to_numpy(zero_copy_only=False)
    has_ts = v.timestamps.is_valid().to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(is_value & ~has_ts)
    if bad.size:
        raise CorruptFile(
            f"{name}: record at offset {first + int(bad[0])} has a null {field!r} (timestamp_field); "
            "only tombstones may lack a timestamp"
        )
    ts: np.ndarray = v.timestamps.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    if v.divisor != 1:
        ts = ts // v.divisor  # floor, also before 1970
    if n and not has_ts.all():
        if not has_ts.any():
            raise CorruptFile(
                f"{name}: holds only tombstones (null values), so no record carries {field!r} "
                "(timestamp_field) to date them"
            )
        idx = np.where(has_ts, np.arange(n), -1)
        np.maximum.accumulate(idx, out=idx)
        idx[idx < 0] = int(np.argmax(has_ts))
        ts = ts[idx]
    return ts


def check_count(sibling: str, what: str, got: int, name: str, n: int, first: int) -> None:
    """Keys and headers files pair up with their value file one record to one."""
    if got != n:
        raise CorruptFile(
            f"{sibling}: holds {got} {what} records, its value file {name} holds {n}; they "
            f"pair up one to one (first unpaired record at offset {first + min(got, n)})"
        )
