"""The second source format: a topic archived by Confluent's Kafka Connect S3 sink with its
default partitioner and `format.class=AvroFormat` (see docs/kafka-connect-source.md).

    <root>/topics/<topic>/partition=<p>/<topic>+<p>+<start offset>.avro           values
    <root>/topics/<topic>/partition=<p>/<topic>+<p>+<start offset>.keys.avro      store.kafka.keys=true
    <root>/topics/<topic>/partition=<p>/<topic>+<p>+<start offset>.headers.avro   store.kafka.headers=true

The connector keeps no offsets, timestamps or partitions inside the files: the offset of a
record is the file's start offset plus its position, the timestamp comes from a field of the
value (`timestamp_field`), the key from the keys file or a value field (`key_field`).
Connect values have arbitrary schemas, so records are decoded by fastavro's generic reader
and turned into envelope records; see `KafkaConnectSource` for the exact rules.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from compactor.sources.base import ArchiveError, SourceArchive, SourceChunk
from compactor.sources.kafka_connect_avro import (
    Avro,
    binary_array,
    branches,
    encode_json,
    file_schema,
    is_record,
    read_avro,
    scalar_bytes,
    short_schema,
    unwrap,
)
from compactor.sources.kafka_connect_fast import fast_headers, fast_keys, header_null_branch, key_null_branch
from keygroups.envelope import ARROW_SCHEMA, HEADER_TYPE, CorruptFile
from keygroups.errors import OptionError
from keygroups.storage import ObjectNotFound, Storage

__all__ = ["KafkaConnectSource", "OptionError", "KEYS_SUFFIX", "HEADERS_SUFFIX", "encode_json"]

VALUE_SUFFIX = ".avro"
KEYS_SUFFIX = ".keys.avro"
HEADERS_SUFFIX = ".headers.avro"
TOPICS_DIR = "topics"  # the connector's `topics.dir` default

# Kafka topic names are [a-zA-Z0-9._-]+, so '+' safely separates the name's parts.
_FILE = r"(?P<ftopic>[^/+]+)\+(?P<fpart>\d+)\+(?P<start>\d+)(?P<kind>\.keys|\.headers)?\.avro"
_IN_TOPICS_DIR = re.compile(rf"^(?P<topic>[^/]+)/partition=(?P<part>\d+)/{_FILE}$")
_UNDER_ROOT = re.compile(rf"^{TOPICS_DIR}/(?P<topic>[^/]+)/partition=(?P<part>\d+)/{_FILE}$")
# Divisor from the timestamp field's unit to milliseconds.
_TS_DIVISOR = {
    None: 1,
    "timestamp-millis": 1,
    "local-timestamp-millis": 1,
    "timestamp-micros": 1_000,
    "local-timestamp-micros": 1_000,
    "timestamp-nanos": 1_000_000,
    "local-timestamp-nanos": 1_000_000,
}


# --- the source ---------------------------------------------------------------------------


class KafkaConnectSource(SourceArchive):
    """A Kafka Connect S3 sink archive (default partitioner, Avro format) read as envelope
    records.

    Root: the store may be rooted at the folder that holds `topics/` (the connector's
    `topics.dir`, default "topics") or at the topics folder itself. Which one is decided from
    the listing: if any key looks like `topics/<topic>/partition=<p>/<file>`, the root is the
    parent and only keys under `topics/` are considered; otherwise keys must look like
    `<topic>/partition=<p>/<file>`. Use the second form for a non-default `topics.dir`.

    Per record of a value file `<topic>+<p>+<start>.avro`:
    - offset = start + position in the file (exact only if the connector wrote every record
      of the range: dropped tombstones or filtering SMTs shift later offsets);
    - timestamp = value field `timestamp_field`: int/long epoch ms, or a timestamp-millis /
      -micros / -nanos (local- too) logical type, floored to ms. A tombstone (null value)
      takes the timestamp of the record before it in the file, or after it if it leads;
    - key = the record of `.keys.avro` when that file exists, else value field `key_field`,
      else null; string keys as UTF-8, bytes/fixed as they are, other types as compact JSON;
    - value = compact JSON text of the value record in UTF-8 (schema field order, bytes and
      fixed as base64 like Connect's JsonConverter, logical types as their Avro value:
      timestamps as epoch integers in their own unit, dates as days, decimals as exact
      strings); null stays null;
    - headers = the records of `.headers.avro` when it exists (key, UTF-8 value), else none.

    Picklable: it holds the store and the options only.
    """

    def __init__(
        self,
        store: Storage,
        *,
        key_field: str | None = None,
        timestamp_field: str | None = None,
        threads: int = 16,
    ):
        if not timestamp_field:
            raise OptionError(
                f"{store.url}: the Kafka Connect layout needs timestamp_field (--timestamp-field): "
                "its files keep no Kafka timestamps, so name the value field holding the event time"
            )
        self.store = store
        self.key_field = key_field or None
        self.timestamp_field = timestamp_field
        self.threads = threads

    def __repr__(self) -> str:
        return (
            f"KafkaConnectSource({self.store.url!r}, key_field={self.key_field!r}, "
            f"timestamp_field={self.timestamp_field!r})"
        )

    # -- listing

    def list_chunks(self) -> list[SourceChunk]:
        """One chunk per value file, from a single listing. Raises ArchiveError for names
        outside the layout, two value files of a partition with the same start offset, and
        keys/headers files without their value file."""
        url = self.store.url_for
        listing = [o for o in self.store.list() if o.key.endswith(".avro")]
        if any(_UNDER_ROOT.match(o.key) for o in listing):
            pattern, shape = _UNDER_ROOT, f"{TOPICS_DIR}/<topic>/partition=<p>/<topic>+<p>+<start offset>.avro"
            listing = [o for o in listing if o.key.startswith(TOPICS_DIR + "/")]
        else:
            pattern, shape = _IN_TOPICS_DIR, "<topic>/partition=<p>/<topic>+<p>+<start offset>.avro"
        chunks: dict[tuple[str, int, int], SourceChunk] = {}
        siblings: list[str] = []
        for obj in listing:
            m = pattern.match(obj.key)
            if not m:
                raise ArchiveError(
                    f"{url(obj.key)}: not a Kafka Connect S3 sink file ({shape}, keys and headers "
                    "as .keys.avro / .headers.avro); only the default partitioner's layout is read"
                )
            topic, part = m["topic"], int(m["part"])
            if m["ftopic"] != topic or int(m["fpart"]) != part:
                raise ArchiveError(
                    f"{url(obj.key)}: file name says topic {m['ftopic']} partition {int(m['fpart'])}, "
                    f"its folder says topic {topic} partition {part}"
                )
            if m["kind"]:
                siblings.append(obj.key)
                continue
            start = int(m["start"])
            chunk = SourceChunk(key=obj.key, topic=topic, partition=part, first_offset=start, size=obj.size)
            other = chunks.setdefault((topic, part, start), chunk)
            if other is not chunk:
                raise ArchiveError(
                    f"{url(other.key)} and {url(obj.key)}: two value files of {topic} partition {part} "
                    f"start at offset {start}"
                )
        values = {c.key[: -len(VALUE_SUFFIX)] for c in chunks.values()}
        for key in siblings:
            stem = key[: -len(KEYS_SUFFIX if key.endswith(KEYS_SUFFIX) else HEADERS_SUFFIX)]
            if stem not in values:
                raise ArchiveError(f"{url(key)}: has no value file {url(stem + VALUE_SUFFIX)}")
        if not chunks:
            raise ArchiveError(f"{self.store.url}: no Kafka Connect value files ({shape}) found")
        return [chunks[k] for k in sorted(chunks)]

    # -- reading

    def _read_optional(self, key: str) -> bytes | None:
        try:
            return self.store.read(key)
        except ObjectNotFound:
            return None

    def read(self, chunk: SourceChunk) -> pa.RecordBatch:
        stem = chunk.key[: -len(VALUE_SUFFIX)]
        with ThreadPoolExecutor(max_workers=2) as pool:  # the siblings' GETs overlap the value's
            keys_f = pool.submit(self._read_optional, stem + KEYS_SUFFIX)
            headers_f = pool.submit(self._read_optional, stem + HEADERS_SUFFIX)
            data = self.store.read(chunk.key)
            keys_data, headers_data = keys_f.result(), headers_f.result()

        name = self.store.url_for(chunk.key)
        first = chunk.first_offset
        value_file = read_avro(data, name, first)
        values = value_file.records
        n = len(values)
        ts_divisor = self._check_value_schema(value_file.schema, name)

        # Timestamps: one list comprehension, then columnar.
        tf = self.timestamp_field
        ts_arr = pa.array([v[tf] if v is not None else None for v in values], pa.int64())
        is_value = np.fromiter((v is not None for v in values), np.bool_, n)
        has_ts = ts_arr.is_valid().to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(is_value & ~has_ts)
        if bad.size:
            raise CorruptFile(
                f"{name}: record at offset {first + int(bad[0])} has a null {tf!r} (timestamp_field); "
                "only tombstones may lack a timestamp"
            )
        ts = ts_arr.fill_null(0).to_numpy(zero_copy_only=False)
        if ts_divisor != 1:
            ts = ts // ts_divisor  # floor, also before 1970
        if n and not has_ts.all():
            if not has_ts.any():
                raise CorruptFile(
                    f"{name}: holds only tombstones (null values), so no record carries {tf!r} "
                    "(timestamp_field) to date them"
                )
            idx = np.where(has_ts, np.arange(n), -1)
            np.maximum.accumulate(idx, out=idx)
            idx[idx < 0] = int(np.argmax(has_ts))
            ts = ts[idx]

        if keys_data is not None:
            keys_name = self.store.url_for(stem + KEYS_SUFFIX)
            null_branch = key_null_branch(file_schema(keys_data, keys_name)[0])
            if null_branch is not None:
                keys = fast_keys(keys_data, keys_name, first, null_branch)
            else:
                _, key_items = unwrap(read_avro(keys_data, keys_name, first), "key", "RecordKey")
                keys = binary_array(key_items)
            self._check_count(keys_name, "keys", len(keys), name, n, first)
        elif self.key_field:
            kf = self.key_field
            keys = binary_array([v[kf] if v is not None else None for v in values])
        else:
            keys = pa.nulls(n, pa.binary())

        if headers_data is not None:
            headers_name = self.store.url_for(stem + HEADERS_SUFFIX)
            null_branch = header_null_branch(file_schema(headers_data, headers_name)[0])
            if null_branch is not None:
                headers = fast_headers(headers_data, headers_name, first, null_branch)
                self._check_count(headers_name, "headers", len(headers), name, n, first)
            else:
                headers = self._headers(read_avro(headers_data, headers_name, first), headers_name, name, n, first)
        else:
            headers = pa.ListArray.from_arrays(np.zeros(n + 1, np.int32), pa.array([], HEADER_TYPE))

        try:
            value_bytes = pa.array([encode_json(v) if v is not None else None for v in values], pa.binary())
        except TypeError as exc:
            raise CorruptFile(f"{name}: a value cannot be encoded as JSON: {exc}") from None
        return pa.RecordBatch.from_arrays(
            [
                pa.array(np.full(n, chunk.partition, np.int32)),
                pa.array(first + np.arange(n, dtype=np.int64)),
                pa.array(ts.astype(np.int64, copy=False)).view(pa.timestamp("ms", tz="UTC")),
                keys,
                value_bytes,
                headers,
            ],
            schema=ARROW_SCHEMA,
        )

    def _check_value_schema(self, schema: Any, name: str) -> int:
        """The timestamp unit divisor; OptionError unless every record branch of the value
        schema has the timestamp field (of a usable type) and the key field."""
        records = branches(schema)
        if not records or not all(is_record(r) for r in records):
            raise OptionError(
                f"{name}: timestamp_field {self.timestamp_field!r} needs record values; the value "
                f"schema is {short_schema(schema)}"
            )
        divisors = set()
        for rec in records:
            fields = {f["name"]: f["type"] for f in rec.get("fields", [])}
            for option, field in (("timestamp_field", self.timestamp_field), ("key_field", self.key_field)):
                if field is not None and field not in fields:
                    raise OptionError(
                        f"{name}: {option} {field!r} is not a field of the value schema "
                        f"{rec.get('name', '?')} (fields: {', '.join(fields) or 'none'})"
                    )
            divisors.add(_ts_divisor(fields[self.timestamp_field]))
        if None in divisors or len(divisors) != 1:
            types = [next(f["type"] for f in r["fields"] if f["name"] == self.timestamp_field) for r in records]
            raise OptionError(
                f"{name}: timestamp_field {self.timestamp_field!r} must be an int/long of epoch "
                f"milliseconds or a timestamp-millis/-micros/-nanos long; it is {' / '.join(map(short_schema, types))}"
            )
        return divisors.pop()

    @staticmethod
    def _check_count(sibling: str, what: str, got: int, name: str, n: int, first: int) -> None:
        if got != n:
            raise CorruptFile(
                f"{sibling}: holds {got} {what} records, its value file {name} holds {n}; they "
                f"pair up one to one (first unpaired record at offset {first + min(got, n)})"
            )

    def _headers(self, avro: Avro, hname: str, name: str, n: int, first: int) -> pa.Array:
        schema, items = unwrap(avro, "headers", "RecordHeaders")
        arrays = branches(schema)
        ok = (
            len(arrays) == 1
            and isinstance(arrays[0], dict)
            and arrays[0].get("type") == "array"
            and all(is_record(r) for r in branches(arrays[0].get("items")))
            and all({"key", "value"} <= {f["name"] for f in r["fields"]} for r in branches(arrays[0]["items"]))
        )
        if not ok:
            raise CorruptFile(
                f"{hname}: not a Kafka Connect headers file (an array of {{key, value}} records); "
                f"schema {short_schema(avro.schema)}"
            )
        self._check_count(hname, "headers", len(items), name, n, first)
        items = [h if h is not None else [] for h in items]
        try:
            return pa.array(items, pa.list_(HEADER_TYPE))
        except (pa.ArrowTypeError, pa.ArrowInvalid, TypeError):  # non-string values: the key rule
            return pa.array(
                [[{"key": x["key"], "value": scalar_bytes(x["value"])} for x in h] for h in items],
                pa.list_(HEADER_TYPE),
            )


def _ts_divisor(ftype: Any) -> int | None:
    """Divisor to milliseconds for a timestamp field type, None if it is not one."""
    one = branches(ftype)
    if len(one) != 1:
        return None
    t = one[0]
    if isinstance(t, str):
        return 1 if t in ("int", "long") else None
    if isinstance(t, dict) and t.get("type") in ("int", "long"):
        return _TS_DIVISOR.get(t.get("logicalType"))
    return None
