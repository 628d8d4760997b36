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

import base64
import io
import json
import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa

from compactor.sources.base import ArchiveError, SourceArchive, SourceChunk
from keygroups import envelope
from keygroups._numba import njit
from keygroups.envelope import ARROW_SCHEMA, HEADER_TYPE, CorruptFile, framing
from keygroups.envelope.buffers import arrow_binary
from keygroups.errors import HeaderTruncated, OptionError
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

_AVRO_HEADER = fastavro.parse_schema(
    {
        "type": "record",
        "name": "org.apache.avro.file.Header",
        "fields": [
            {"name": "magic", "type": {"type": "fixed", "name": "Magic", "size": 4}},
            {"name": "meta", "type": {"type": "map", "values": "bytes"}},
            {"name": "sync", "type": {"type": "fixed", "name": "Sync", "size": 16}},
        ],
    }
)
# Logical types read as their underlying Avro value: fastavro would build a datetime/date/
# time/UUID object per field, which costs time and hides the unit of a timestamp.
_RAW_LOGICAL = {
    "timestamp-millis",
    "timestamp-micros",
    "timestamp-nanos",
    "local-timestamp-millis",
    "local-timestamp-micros",
    "local-timestamp-nanos",
    "date",
    "time-millis",
    "time-micros",
    "uuid",
}
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


# --- values to bytes -------------------------------------------------------------------


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray, memoryview)):
        # What Connect's JsonConverter does with BYTES: base64 text.
        return base64.b64encode(obj).decode("ascii")
    if isinstance(obj, Decimal):
        return str(obj)  # exact; a JSON number would round through a double
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


_ENCODE = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False, default=_json_default
).encode


def _finite(obj: Any) -> Any:
    """`obj` with NaN and infinities as the strings Jackson writes for them by default."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if obj != obj else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def encode_json(obj: Any) -> str:
    """Compact JSON text of a decoded Avro datum (field order kept, non-ASCII kept, bytes as
    base64, decimals as exact strings, NaN/Infinity as strings)."""
    try:
        return _ENCODE(obj)
    except ValueError:  # allow_nan=False: only non-finite floats get here
        return _ENCODE(_finite(obj))


def _scalar_bytes(obj: Any) -> str | bytes | None:
    """A key as bytes (str is encoded as UTF-8 by Arrow): strings as their UTF-8 text, bytes
    and fixed as they are, null as null, anything else as its compact JSON text."""
    if obj is None or isinstance(obj, (str, bytes)):
        return obj
    return encode_json(obj)


def _binary_array(items: list[Any]) -> pa.Array:
    try:  # str, bytes and None convert in C; anything else takes the per-item rule
        return pa.array(items, pa.binary())
    except (pa.ArrowTypeError, pa.ArrowInvalid, TypeError):
        return pa.array([_scalar_bytes(x) for x in items], pa.binary())


# --- schemas ----------------------------------------------------------------------------


def _raw_logical(schema: Any) -> tuple[Any, bool]:
    """`schema` without the logical types in _RAW_LOGICAL, and whether any was removed."""
    if isinstance(schema, list):
        out = [_raw_logical(s) for s in schema]
        return [s for s, _ in out], any(c for _, c in out)
    if not isinstance(schema, dict):
        return schema, False
    changed = False
    new = dict(schema)
    if new.get("logicalType") in _RAW_LOGICAL:
        del new["logicalType"]
        changed = True
    for key in ("type", "items", "values"):
        if isinstance(new.get(key), (dict, list)):
            new[key], c = _raw_logical(new[key])
            changed |= c
    if isinstance(new.get("fields"), list):
        fields = []
        for f in new["fields"]:
            t, c = _raw_logical(f.get("type"))
            fields.append({**f, "type": t})
            changed |= c
        new["fields"] = fields
    return new, changed


def _branches(schema: Any) -> list[Any]:
    """The non-null branches of a union, or [schema]."""
    if isinstance(schema, list):
        return [s for s in schema if s != "null" and s != {"type": "null"}]
    return [schema]


def _is_record(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") in ("record", "error")


def _short(schema: Any) -> str:
    text = json.dumps(schema)
    return text if len(text) <= 120 else text[:117] + "..."


@dataclass(frozen=True)
class _Avro:
    """One decoded Avro file: its schema as written (logical types intact) and its data."""

    schema: Any
    records: list[Any]


def _file_schema(data: bytes, name: str) -> tuple[Any, dict, int]:
    """(schema as written, header, header length) of an Avro object container file."""
    try:
        meta, sync, end = framing.read_header(memoryview(data), name)
        return json.loads(meta["avro.schema"]), {"magic": framing.MAGIC, "meta": meta, "sync": sync}, end
    except (HeaderTruncated, KeyError, ValueError) as exc:
        raise CorruptFile(f"{name}: not a readable Avro object container file ({exc})") from None


def _read_avro(data: bytes, name: str, first_offset: int) -> _Avro:
    """All records of one file, logical types read raw. Raises CorruptFile naming the file
    and the first offset that could not be read."""
    schema, head, head_end = _file_schema(data, name)
    raw, changed = _raw_logical(schema)
    if changed:  # same block bytes, a header whose schema fastavro reads without conversion
        meta = dict(head["meta"], **{"avro.schema": json.dumps(raw).encode()})
        out = io.BytesIO()
        fastavro.schemaless_writer(out, _AVRO_HEADER, {**head, "meta": meta})
        data = out.getvalue() + data[head_end:]
    records: list[Any] = []
    try:
        records.extend(fastavro.reader(io.BytesIO(data), return_record_name=False))
    except Exception as exc:
        raise _truncated(name, first_offset, len(records), exc) from None
    return _Avro(schema, records)


def _truncated(name: str, first_offset: int, done: int, exc: Exception) -> CorruptFile:
    return CorruptFile(
        f"{name}: truncated or corrupt Avro data after {done} records (at offset {first_offset + done}): "
        f"{type(exc).__name__}: {exc}"
    )


def _unwrap(avro: _Avro, field: str, struct: str) -> tuple[Any, list[Any]]:
    """Newer connector versions can write keys/headers "enveloped" in a one-field record
    (RecordKey{key} / RecordHeaders{headers}); give back the inner schema and data."""
    schema = avro.schema
    one = _branches(schema)
    if len(one) == 1 and _is_record(one[0]):
        fields = one[0].get("fields", [])
        if one[0].get("name", "").rpartition(".")[2] == struct and [f["name"] for f in fields] == [field]:
            return fields[0]["type"], [r[field] if r is not None else None for r in avro.records]
    return schema, avro.records


# --- keys and headers files: fixed shapes, compiled decoding ----------------------------
# The connector writes keys as (nullable) strings or bytes and headers as an array of
# {key: string, value: string} records. fastavro would build a Python object per key and a
# list of dicts per record (headers decode at about the speed of the values); these loops
# decode fastavro's raw blocks straight into Arrow buffers. Other shapes take fastavro.

_EOF, _BAD_UNION, _NEGATIVE, _EXTRA = envelope.ERR_EOF, envelope.ERR_UNION, envelope.ERR_NEGATIVE, 4
_ERRORS = {
    _EOF: "data ends inside a record",
    _BAD_UNION: "bad union branch",
    _NEGATIVE: "negative length",
    _EXTRA: "a block holds more bytes than its records",
}


# Avro's zigzag varints and length-prefixed bytes, as the envelope decoder reads them.
_varint = envelope.read_varint
_copy_bytes = envelope.read_bytes


@njit(cache=True, nogil=True)
def _branch(buf, pos, end, null_branch):
    """(is null, new pos, error) of an optional value; null_branch -1: not a union."""
    if null_branch < 0:
        return False, pos, 0
    b, pos = _varint(buf, pos, end)
    if pos < 0:
        return False, pos, _EOF
    if b != 0 and b != 1:
        return False, pos, _BAD_UNION
    return b == null_branch, pos, 0


@njit(cache=True, nogil=True)
def _decode_keys(buf, ends, counts, null_branch, off, data, valid):
    """Records of a keys file; returns (records decoded, error)."""
    i = 0
    dp = 0
    pos = 0
    for b in range(ends.shape[0]):
        end = ends[b]
        for _ in range(counts[b]):
            off[i] = dp
            is_null, pos, err = _branch(buf, pos, end, null_branch)
            if err:
                return i, err
            valid[i] = not is_null
            if not is_null:
                pos, dp, err = _copy_bytes(buf, pos, end, data, dp)
                if err:
                    return i, err
            i += 1
        if pos != end:
            return i, _EXTRA
    off[i] = dp
    return i, 0


@njit(cache=True, nogil=True)
def _decode_headers(buf, ends, counts, null_branch, h_off, k_off, k_data, v_off, v_data, v_valid):
    """Records of a headers file; returns (records decoded, items decoded, error)."""
    i = 0
    j = 0
    kp = 0
    vp = 0
    pos = 0
    for b in range(ends.shape[0]):
        end = ends[b]
        for _ in range(counts[b]):
            h_off[i] = j
            while True:  # array blocks: count, items, ... until a zero count
                count, pos = envelope.read_block_count(buf, pos, end)
                if pos < 0:
                    return i, j, _EOF
                if count == 0:
                    break
                for _ in range(count):
                    if j >= k_off.shape[0] - 1:
                        return i, j, _EOF
                    k_off[j] = kp
                    v_off[j] = vp
                    pos, kp, err = _copy_bytes(buf, pos, end, k_data, kp)
                    if err:
                        return i, j, err
                    is_null, pos, err = _branch(buf, pos, end, null_branch)
                    if err:
                        return i, j, err
                    v_valid[j] = not is_null
                    if not is_null:
                        pos, vp, err = _copy_bytes(buf, pos, end, v_data, vp)
                        if err:
                            return i, j, err
                    j += 1
            i += 1
        if pos != end:
            return i, j, _EXTRA
    h_off[i] = j
    k_off[j] = kp
    v_off[j] = vp
    return i, j, 0


def _text_like(t: Any) -> bool:
    return t in ("string", "bytes") or (
        isinstance(t, dict) and t.get("type") in ("string", "bytes") and t.get("logicalType") in (None, "uuid")
    )


def _null_branch(schema: Any) -> int | None:
    """-1 for a string/bytes schema, the null's index for a [null, string/bytes] union, None
    for anything else."""
    if _text_like(schema):
        return -1
    if isinstance(schema, list) and len(schema) == 2:
        nulls = [i for i, t in enumerate(schema) if t == "null" or t == {"type": "null"}]
        if len(nulls) == 1 and _text_like(schema[1 - nulls[0]]):
            return nulls[0]
    return None


def _header_null_branch(schema: Any) -> int | None:
    """The value's null branch for the connector's headers shape (array of {key: string,
    value: string/bytes, maybe nullable}), None for any other shape."""
    if not (isinstance(schema, dict) and schema.get("type") == "array" and _is_record(schema.get("items"))):
        return None
    fields = schema["items"].get("fields", [])
    if [f["name"] for f in fields] != ["key", "value"] or _null_branch(fields[0]["type"]) != -1:
        return None
    return _null_branch(fields[1]["type"])


def _raw_blocks(data: bytes, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(decompressed block bytes back to back, block ends, block record counts)."""
    blocks = framing.read_blocks(data, name).contiguous()
    buf, counts = blocks.buf, blocks.counts
    if buf.size >= 2**31 or (counts < 0).any() or counts.sum() > buf.size:
        raise CorruptFile(f"{name}: block headers claim {int(counts.sum())} records in {buf.size} bytes")
    return buf, blocks.ends, counts


def _fail(name: str, first: int, at: int, err: int) -> CorruptFile:
    return CorruptFile(f"{name}: {_ERRORS[err]} at record {at} (offset {first + at})")


def _fast_keys(data: bytes, name: str, first: int, null_branch: int) -> pa.Array:
    buf, ends, counts = _raw_blocks(data, name)
    n = int(counts.sum())
    off = np.empty(n + 1, np.int32)
    out = np.empty(buf.size, np.uint8)
    valid = np.empty(n, np.bool_)
    got, err = _decode_keys(buf, ends, counts, null_branch, off, out, valid)
    if err:
        raise _fail(name, first, got, err)
    return arrow_binary(n, off, out[: off[n]], valid)


def _fast_headers(data: bytes, name: str, first: int, null_branch: int) -> pa.Array:
    buf, ends, counts = _raw_blocks(data, name)
    n = int(counts.sum())
    items = buf.size // 2 + 1  # every item takes at least two bytes
    h_off = np.empty(n + 1, np.int32)
    k_off, v_off = np.empty(items + 1, np.int32), np.empty(items + 1, np.int32)
    k_data, v_data = np.empty(buf.size, np.uint8), np.empty(buf.size, np.uint8)
    v_valid = np.empty(items, np.bool_)
    got, m, err = _decode_headers(buf, ends, counts, null_branch, h_off, k_off, k_data, v_off, v_data, v_valid)
    if err:
        raise _fail(name, first, got, err)
    keys = arrow_binary(m, k_off, k_data[: k_off[m]], None, pa.string())
    try:
        keys.validate(full=True)  # Avro strings are UTF-8
    except pa.ArrowInvalid as exc:
        raise CorruptFile(f"{name}: a header key is not UTF-8 ({exc})") from None
    values = arrow_binary(m, v_off, v_data[: v_off[m]], v_valid)
    items_arr = pa.StructArray.from_arrays([keys, values], fields=list(HEADER_TYPE))
    return pa.ListArray.from_arrays(pa.array(h_off), items_arr)


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
        value_file = _read_avro(data, name, first)
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
            null_branch = _null_branch(_file_schema(keys_data, keys_name)[0])
            if null_branch is not None:
                keys = _fast_keys(keys_data, keys_name, first, null_branch)
            else:
                _, key_items = _unwrap(_read_avro(keys_data, keys_name, first), "key", "RecordKey")
                keys = _binary_array(key_items)
            self._check_count(keys_name, "keys", len(keys), name, n, first)
        elif self.key_field:
            kf = self.key_field
            keys = _binary_array([v[kf] if v is not None else None for v in values])
        else:
            keys = pa.nulls(n, pa.binary())

        if headers_data is not None:
            headers_name = self.store.url_for(stem + HEADERS_SUFFIX)
            null_branch = _header_null_branch(_file_schema(headers_data, headers_name)[0])
            if null_branch is not None:
                headers = _fast_headers(headers_data, headers_name, first, null_branch)
                self._check_count(headers_name, "headers", len(headers), name, n, first)
            else:
                headers = self._headers(_read_avro(headers_data, headers_name, first), headers_name, name, n, first)
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
        records = _branches(schema)
        if not records or not all(_is_record(r) for r in records):
            raise OptionError(
                f"{name}: timestamp_field {self.timestamp_field!r} needs record values; the value "
                f"schema is {_short(schema)}"
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
                f"milliseconds or a timestamp-millis/-micros/-nanos long; it is {' / '.join(map(_short, types))}"
            )
        return divisors.pop()

    @staticmethod
    def _check_count(sibling: str, what: str, got: int, name: str, n: int, first: int) -> None:
        if got != n:
            raise CorruptFile(
                f"{sibling}: holds {got} {what} records, its value file {name} holds {n}; they "
                f"pair up one to one (first unpaired record at offset {first + min(got, n)})"
            )

    def _headers(self, avro: _Avro, hname: str, name: str, n: int, first: int) -> pa.Array:
        schema, items = _unwrap(avro, "headers", "RecordHeaders")
        arrays = _branches(schema)
        ok = (
            len(arrays) == 1
            and isinstance(arrays[0], dict)
            and arrays[0].get("type") == "array"
            and all(_is_record(r) for r in _branches(arrays[0].get("items")))
            and all({"key", "value"} <= {f["name"] for f in r["fields"]} for r in _branches(arrays[0]["items"]))
        )
        if not ok:
            raise CorruptFile(
                f"{hname}: not a Kafka Connect headers file (an array of {{key, value}} records); "
                f"schema {_short(avro.schema)}"
            )
        self._check_count(hname, "headers", len(items), name, n, first)
        items = [h if h is not None else [] for h in items]
        try:
            return pa.array(items, pa.list_(HEADER_TYPE))
        except (pa.ArrowTypeError, pa.ArrowInvalid, TypeError):  # non-string values: the key rule
            return pa.array(
                [[{"key": x["key"], "value": _scalar_bytes(x["value"])} for x in h] for h in items],
                pa.list_(HEADER_TYPE),
            )


def _ts_divisor(ftype: Any) -> int | None:
    """Divisor to milliseconds for a timestamp field type, None if it is not one."""
    one = _branches(ftype)
    if len(one) != 1:
        return None
    t = one[0]
    if isinstance(t, str):
        return 1 if t in ("int", "long") else None
    if isinstance(t, dict) and t.get("type") in ("int", "long"):
        return _TS_DIVISOR.get(t.get("logicalType"))
    return None
