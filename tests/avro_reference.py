"""The reference decoder for the tests: fastavro, record by record. Slow (about 230K
records/s, GIL held) but independent of keyfill's compiled decoder, which property tests
prove equal to it."""

from __future__ import annotations

import io
from datetime import datetime, timedelta, timezone

import fastavro
import pyarrow as pa

from keygroups.envelope.schema import batch_from_records
from keygroups.errors import CorruptFile


def read_avro_records(data: bytes, *, name: str = "<bytes>") -> tuple[dict[str, str], list[dict]]:
    """File metadata and all records, decoded by fastavro (the reference decoder)."""
    try:
        r = fastavro.reader(io.BytesIO(data), return_record_name=False)
        meta = {k: v.decode() if isinstance(v, bytes) else v for k, v in r.metadata.items()}
        return meta, list(r)
    except Exception as exc:  # fastavro raises several types on corrupt input
        raise CorruptFile(f"{name}: not a readable Avro file: {exc}") from exc


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)


def read_avro_batch(data: bytes, *, name: str = "<bytes>") -> tuple[dict[str, str], pa.RecordBatch]:
    meta, recs = read_avro_records(data, name=name)
    for r in recs:
        ts = r["timestamp"]
        if not isinstance(ts, int):  # fastavro gives aware datetimes; exact ms, no float rounding
            r["timestamp"] = (ts - _EPOCH) // _MS
    try:
        return meta, batch_from_records(recs)
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as exc:
        raise CorruptFile(f"{name}: records do not match the envelope schema: {exc}") from exc
