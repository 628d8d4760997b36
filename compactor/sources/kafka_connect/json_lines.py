"""Reading the Kafka Connect S3 sink's JsonFormat files: one JSON document per line, as the
connector's JsonConverter (schemas disabled) or Jackson wrote it, optionally gzip-compressed
(`s3.compression.type=gzip`, `.json.gz`).

Lines are cut with numpy and become an Arrow binary column without a parse: a value keeps
the bytes the connector wrote. Only the timestamp (and key) field is parsed, by pyarrow's
C++ JSON reader; any line it cannot take (a tombstone shape it mis-reads, a float, a syntax
error) sends the file through `json.loads` line by line, which either reads it or names the
record at fault. Both paths give the same result (a property test holds them equal).
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from compactor.sources.kafka_connect.avro import binary_array, header_array
from compactor.sources.kafka_connect.records import Values
from keygroups.envelope import HEADER_TYPE, CorruptFile
from keygroups.errors import OptionError

_INT64 = (-(2**63), 2**63 - 1)
_PLAIN_STRING = re.compile(rb'"[^"\\\x00-\x1f]*"')  # a JSON string without escapes
_HEADERS_SCHEMA = pa.schema([("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())])))])
_HEADERS_OUT = pa.list_(HEADER_TYPE)


def gunzip(data: bytes, name: str) -> bytes:
    """The bytes of a `.json.gz` file (every gzip member, as GZIPInputStream reads them)."""
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:
        raise CorruptFile(f"{name}: not a complete gzip stream ({type(exc).__name__}: {exc})") from None


def lines(data: bytes, name: str, first: int) -> pa.BinaryArray:
    """The file's lines without their terminators (the connector ends every record with the
    JVM's line separator, `\\n` or `\\r\\n`); the last may lack one. An empty line is no
    record the connector writes, so it is refused, naming where it sits."""
    buf = np.frombuffer(data, np.uint8)
    nl = np.flatnonzero(buf == 10)
    ends = nl if buf.size == 0 or buf[-1] == 10 else np.append(nl, buf.size)
    starts = np.concatenate(([0], nl + 1))[: ends.size]
    cr = ends > starts
    cr[cr] = buf[ends[cr] - 1] == 13
    cut = ends - cr  # drop the \r of a \r\n
    lengths = cut - starts
    empty = np.flatnonzero(lengths == 0)
    if empty.size:
        i = int(empty[0])
        raise CorruptFile(f"{name}: line {i + 1} is empty (where the record at offset {first + i} would be)")
    inside = np.ones(buf.size, bool)  # every byte but the terminators
    inside[nl] = False
    inside[cut[cr]] = False
    offsets = np.zeros(ends.size + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise CorruptFile(f"{name}: more than 2 GiB of JSON in one file")
    body = buf[inside]
    return pa.BinaryArray.from_buffers(
        pa.binary(), ends.size, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(body)]
    )


def _parse(line: bytes, name: str, offset: int) -> Any:
    try:
        return json.loads(line)
    except ValueError as exc:  # also UnicodeDecodeError
        raise CorruptFile(f"{name}: the record at offset {offset} is not JSON ({exc})") from None


def _objects_only(text: pa.BinaryArray) -> bool:
    """Whether every line starts a JSON object: pyarrow's reader (26.0) crashes the process on
    a file whose first line is `null`, so only such files are handed to it."""
    if not len(text):
        return False
    _, offsets, body = text.buffers()
    starts = np.frombuffer(offsets, np.int32, len(text), text.offset * 4)
    return bool((np.frombuffer(body, np.uint8)[starts] == ord("{")).all())


def _read_json(data: bytes, schema: pa.Schema, unexpected: str) -> pa.Table | None:
    """The file by pyarrow's C++ reader (one block, one thread: Spark runs a task per core),
    or None where it refuses the file."""
    try:
        return pj.read_json(
            io.BytesIO(data),
            read_options=pj.ReadOptions(use_threads=False, block_size=max(1 << 20, len(data) + 1)),
            parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior=unexpected),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None


def _fast_fields(data: bytes, text: pa.BinaryArray, ts_field: str, key_field: str | None) -> pa.Table | None:
    """ts (int64) and key (string) columns by pyarrow's reader, or None if it cannot take the
    file as it is (then `_slow_fields` decides)."""
    if not _objects_only(text):
        return None
    fields = [(ts_field, pa.int64())] + ([(key_field, pa.string())] if key_field else [])
    table = _read_json(data, pa.schema(fields), "ignore")
    return (
        table if table is not None and table.num_rows == len(text) else None
    )  # it skips blank lines and splits `{} {}`


def _slow_fields(
    texts: list[bytes], name: str, first: int, ts_field: str, key_field: str | None
) -> tuple[pa.Array, pa.Array | None]:
    ts: list[int | None] = []
    keys: list[Any] = []
    for i, line in enumerate(texts):
        doc = _parse(line, name, first + i)
        if doc is None:
            ts.append(None)
            keys.append(None)
            continue
        if not isinstance(doc, dict):
            raise OptionError(
                f"{name}: timestamp_field {ts_field!r} needs JSON object values; the record at offset "
                f"{first + i} is a {type(doc).__name__}"
            )
        t = doc.get(ts_field)
        if t is not None and (type(t) is not int or not _INT64[0] <= t <= _INT64[1]):
            raise CorruptFile(
                f"{name}: the record at offset {first + i} has {ts_field!r} (timestamp_field) = "
                f"{json.dumps(t)[:40]}, not an integer of epoch milliseconds"
            )
        ts.append(t)
        if key_field:
            keys.append(doc.get(key_field))
    return pa.array(ts, pa.int64()), (binary_array(keys) if key_field else None)


def _absent(text: pa.BinaryArray, tomb: np.ndarray, col: pa.Array, option: str, field: str, name: str) -> None:
    """OptionError when no record has `field`: the option names a field the values lack."""
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    if valid.any() or tomb.all():
        return
    doc = json.loads(text[int(np.argmin(tomb))].as_py())
    if isinstance(doc, dict) and field in doc:
        return  # present but null everywhere: the per-record check names the first
    have = ", ".join(doc) if isinstance(doc, dict) else type(doc).__name__
    raise OptionError(f"{name}: {option} {field!r} is in no JSON value of this file (first value's fields: {have})")


def json_values(data: bytes, name: str, first: int, ts_field: str, key_field: str | None) -> Values:
    """Values keep their line's bytes; the line `null` is a tombstone. The timestamp field is
    an integer of epoch milliseconds (what JsonConverter writes for int64 and Timestamp)."""
    text = lines(data, name, first)
    tomb = pc.equal(text, pa.scalar(b"null", pa.binary())).to_numpy(zero_copy_only=False)
    table = _fast_fields(data, text, ts_field, key_field)
    if table is not None:  # every line an object: no tombstones
        ts = table.column(ts_field).combine_chunks()
        keys = binary_array(table.column(key_field).combine_chunks()) if key_field else None
    else:  # `null` parses to None: a tombstone's ts and key are null
        ts, keys = _slow_fields(text.to_pylist(), name, first, ts_field, key_field)
    if not tomb.all():
        _absent(text, tomb, ts, "timestamp_field", ts_field, name)
        if keys is not None and key_field:  # keys: those of key_field
            _absent(text, tomb, keys, "key_field", key_field, name)
    values = pc.if_else(pa.array(tomb), pa.scalar(None, pa.binary()), text) if tomb.any() else text
    return Values(values, ts, 1, keys)


def json_keys(data: bytes, name: str, first: int) -> pa.Array:
    """Keys file: a JSON string key is its UTF-8 text, `null` is null, anything else (numbers,
    structs: JsonConverter's output) keeps the bytes as written."""
    out = []
    for i, line in enumerate(lines(data, name, first).to_pylist()):
        if _PLAIN_STRING.fullmatch(line):  # no escapes: the text between the quotes, unparsed
            out.append(line[1:-1])
            continue
        doc = _parse(line, name, first + i)
        out.append(doc.encode() if isinstance(doc, str) else None if doc is None else line)
    return pa.array(out, pa.binary())


def json_headers(data: bytes, name: str, first: int) -> pa.Array:
    """Headers file: `{"headers": [{"key": k, "value": v}, ...]}` per record (the connector
    envelopes headers in JSON); string values as UTF-8, others by the key rule."""
    text = lines(data, name, first)
    table = _read_json(data, _HEADERS_SCHEMA, "error") if _objects_only(text) else None
    if table is not None and table.num_rows == len(text):
        got = table.column("headers").combine_chunks()
        if got.null_count == 0 and got.flatten().field("key").null_count == 0:
            try:
                return got.cast(_HEADERS_OUT)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                pass
    items = []
    for i, line in enumerate(text.to_pylist()):
        doc = _parse(line, name, first + i)
        hs = doc.get("headers") if isinstance(doc, dict) and set(doc) == {"headers"} else doc
        ok = isinstance(hs, list) and all(
            isinstance(h, dict) and set(h) == {"key", "value"} and isinstance(h["key"], str) for h in hs
        )
        if not ok:
            raise CorruptFile(
                f"{name}: the record at offset {first + i} is not a Kafka Connect headers record "
                f'({{"headers": [{{"key": ..., "value": ...}}, ...]}}): {line[:80]!r}'
            )
        items.append(hs)
    return header_array(items)
