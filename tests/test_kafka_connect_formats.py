"""The Kafka Connect layout in JsonFormat and ParquetFormat (and keys/headers files in any
of the three formats), the dropped-records policy, and compact + `keyfill verify` + replay.

Fixtures come from independent writers, named as the connector names them: JSON lines by
Python's json module (compact separators, as Jackson writes) and gzip; Parquet by
pyarrow.parquet in the shape parquet-avro gives AvroData's schemas (a value record's
columns, keys enveloped in `RecordKey {key}`, headers in `RecordHeaders {headers: [{key,
value}]}`); Avro by fastavro.
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import io
import json
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kafka_connect import fresh, put_avro, read_all

import reader
from compactor.errors import ArchiveError
from compactor.job import CompactConfig, compact
from compactor.sources import open_source
from compactor.sources.kafka_connect import KafkaConnectSource
from compactor.sources.kafka_connect.json_lines import json_values
from keygroups import compacted
from keygroups.envelope import CorruptFile
from keygroups.errors import OptionError
from keygroups.storage import open_storage

TOPIC = "payments"
T0 = 1_767_225_600_000
# (file format, the extension the connector gives it)
FORMATS = [
    ("json", ".json"),
    ("json", ".json.gz"),
    ("parquet", ".parquet"),  # parquet.codec=none
    ("parquet", ".snappy.parquet"),  # the default codec
    ("parquet", ".gz.parquet"),
    ("parquet", ".zstd.parquet"),
]
_PARQUET_CODEC = {".parquet": "none", ".snappy.parquet": "snappy", ".gz.parquet": "gzip", ".zstd.parquet": "zstd"}


def make_records(partition: int, n: int, *, first: int = 0, seed: int = 0) -> list[dict]:
    """Source records as the connector sees them: a string key, a payment struct value, and
    at least one string header (the connector refuses null keys and empty headers when it
    stores them)."""
    rng = np.random.default_rng(seed + partition)
    out = []
    for i in range(n):
        user = f"user-{int(rng.integers(0, 7))}"
        ts = T0 + 10 * i - int(rng.integers(0, 30))
        value = {
            "user": None if rng.random() < 0.1 else user,
            "amount": float(rng.integers(100, 99999)) / 100,
            "merchant": f"m-é{int(rng.integers(0, 40)):02d}",
            "currency": "EUR",
            "ts": ts,
        }
        headers = [{"key": "trace-id", "value": "%016x" % (first + i)}] + ([{"key": "src", "value": "web"}] * (i % 2))
        out.append(
            {"partition": partition, "offset": first + i, "ts": ts, "key": user, "value": value, "headers": headers}
        )
    return out


def stem(partition: int, start: int, pad: int = 10) -> str:
    return f"topics/{TOPIC}/partition={partition}/{TOPIC}+{partition}+{start:0{pad}d}"


# --- independent writers ---------------------------------------------------------------------


def jline(doc) -> bytes:
    """What JsonConverter (schemas off) / Jackson write: compact, UTF-8, non-ASCII as is."""
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def put_json(store, key: str, docs: list, *, newline: bytes = b"\n") -> None:
    data = b"".join(jline(d) + newline for d in docs)
    store.write(key, gzip.compress(data) if key.endswith(".gz") else data)


VALUE_SCHEMA = pa.schema(
    [
        pa.field("user", pa.string()),  # optional: ["null","string"]
        pa.field("amount", pa.float64(), nullable=False),
        pa.field("merchant", pa.string(), nullable=False),
        pa.field("currency", pa.string(), nullable=False),
        pa.field("ts", pa.timestamp("ms", tz="UTC"), nullable=False),  # Connect Timestamp -> timestamp-millis
    ]
)
KEY_SCHEMA = pa.schema([pa.field("key", pa.string())])  # RecordKey {key: optional string}
HEADERS_SCHEMA = pa.schema(
    [
        pa.field(
            "headers",
            pa.list_(
                pa.field(
                    "element",
                    pa.struct([pa.field("key", pa.string(), False), pa.field("value", pa.string(), False)]),
                    False,
                )
            ),
            False,
        )
    ]
)


def put_parquet(store, key: str, rows: list[dict], schema: pa.Schema, codec: str = "snappy") -> None:
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), out, compression=codec)
    store.write(key, out.getvalue())


def write_files(store, recs: list[dict], ext: str, per_file: int, *, keys=True, headers=True, pad=10) -> list[str]:
    """One partition's records in files of `per_file` records, as the connector cuts them."""
    written = []
    for at in range(0, len(recs), per_file):
        part = recs[at : at + per_file]
        s = stem(part[0]["partition"], part[0]["offset"], pad)
        if ext.startswith(".json"):
            put_json(store, s + ext, [r["value"] for r in part])
            if keys:
                put_json(store, s + ".keys" + ext, [r["key"] for r in part])
            if headers:
                put_json(store, s + ".headers" + ext, [{"headers": r["headers"]} for r in part])
        else:
            codec = _PARQUET_CODEC[ext]
            rows = [{**r["value"], "ts": r["value"]["ts"]} for r in part]
            for row in rows:
                row["ts"] = dt.datetime.fromtimestamp(row["ts"] / 1000, dt.timezone.utc)
            put_parquet(store, s + ext, rows, VALUE_SCHEMA, codec)
            if keys:
                put_parquet(store, s + ".keys" + ext, [{"key": r["key"]} for r in part], KEY_SCHEMA, codec)
            if headers:
                put_parquet(
                    store, s + ".headers" + ext, [{"headers": r["headers"]} for r in part], HEADERS_SCHEMA, codec
                )
        written.append(s + ext)
    return written


def check_records(got: pa.Table, want: list[dict], ext: str, *, keys=True, headers=True) -> None:
    rows = got.to_pylist()
    assert [(r["partition"], r["offset"]) for r in rows] == [(w["partition"], w["offset"]) for w in want]
    for g, w in zip(rows, want):
        assert int(g["timestamp"].timestamp() * 1000) == w["ts"]
        assert g["key"] == (w["key"].encode() if keys else None)
        assert g["headers"] == (
            [{"key": h["key"], "value": h["value"].encode()} for h in w["headers"]] if headers else []
        )
        if ext.startswith(".json"):
            assert g["value"] == jline(w["value"])  # the line's bytes, as written
        else:
            assert g["value"].decode() == json.dumps(w["value"], separators=(",", ":"), ensure_ascii=False)


# --- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,ext", FORMATS, ids=[e for _, e in FORMATS])
def test_round_trip(storage_url, fmt, ext):
    store = fresh(storage_url)
    want = make_records(0, 23, first=1000) + make_records(1, 9)
    for p in (0, 1):
        write_files(store, [r for r in want if r["partition"] == p], ext, per_file=5)
    src = open_source(store.url, format="kafka-connect", options={"timestamp_field": "ts"})
    chunks = src.list_chunks()
    assert [c.key for c in chunks] == [
        stem(p, s) + ext for p, s in [(0, o) for o in range(1000, 1023, 5)] + [(1, 0), (1, 5)]
    ]
    assert all(c.keys_file == stem(c.partition, c.first_offset) + ".keys" + ext for c in chunks)
    check_records(read_all(src), want, ext)
    # Without keys files the key comes from key_field; without headers files there are none.
    bare = fresh(storage_url)
    for p in (0, 1):
        write_files(bare, [r for r in want if r["partition"] == p], ext, per_file=7, keys=False, headers=False)
    got = read_all(KafkaConnectSource(bare, key_field="user", timestamp_field="ts"))
    assert got.column("key").to_pylist() == [
        None if w["value"]["user"] is None else w["value"]["user"].encode() for w in want
    ]
    assert got.column("headers").to_pylist() == [[]] * len(want)


def test_keys_and_headers_in_another_format_than_the_values(local_url):
    """keys.format.class / headers.format.class may differ from format.class: the connector
    strips the value extension and each writer adds its own."""
    store = fresh(local_url)
    want = make_records(0, 6)
    s = stem(0, 0)
    put_json(store, s + ".json", [r["value"] for r in want])
    put_avro(store, s + ".keys.avro", ["null", "string"], [r["key"] for r in want])
    put_parquet(store, s + ".headers.snappy.parquet", [{"headers": r["headers"]} for r in want], HEADERS_SCHEMA)
    src = KafkaConnectSource(store, timestamp_field="ts")
    check_records(read_all(src), want, ".json")
    store.write(s + ".keys.json", b'"x"\n')
    with pytest.raises(ArchiveError, match="two keys files for one value file") as err:
        src.list_chunks()
    assert store.url_for(s + ".keys.avro") in str(err.value) and store.url_for(s + ".keys.json") in str(err.value)


def test_json_lines_keep_their_bytes(local_url):
    """Values are the lines as written (CRLF terminators of a Windows worker cut off, number
    spellings kept); the line `null` is a tombstone dated by its neighbour; JSON keys that are
    strings become their text, other keys keep their JSON bytes."""
    store = fresh(local_url)
    s = stem(0, 7)
    store.write(s + ".json", b'{"ts":5,"x":1.50,"t":"\\u00e9"}\r\nnull\r\n{"ts":9,"n":[1,2]}')  # no final newline
    store.write(s + ".keys.json", b'"k\\"1"\n{"id":7}\n42\n')
    got = read_all(KafkaConnectSource(store, timestamp_field="ts")).to_pylist()
    assert [r["value"] for r in got] == [b'{"ts":5,"x":1.50,"t":"\\u00e9"}', None, b'{"ts":9,"n":[1,2]}']
    assert [int(r["timestamp"].timestamp() * 1000) for r in got] == [5, 5, 9]
    assert [r["offset"] for r in got] == [7, 8, 9]
    assert [r["key"] for r in got] == [b'k"1', b'{"id":7}', b"42"]


def test_parquet_values_follow_the_avro_encoding(local_url):
    """Logical types as their underlying values (timestamps in their unit, dates as days,
    times of day), decimals as exact strings, bytes as base64, maps as objects, lists,
    nested records and nulls; keys of a struct type as compact JSON."""
    store = fresh(local_url)
    s = stem(0, 0)
    schema = pa.schema(
        [
            pa.field("ts", pa.timestamp("us", tz="UTC"), False),
            ("day", pa.date32()),
            ("at", pa.time32("ms")),
            ("price", pa.decimal128(9, 2)),
            ("raw", pa.binary()),
            ("m", pa.map_(pa.string(), pa.float64())),
            ("tags", pa.list_(pa.string())),
            ("nested", pa.struct([("a", pa.int32()), ("when", pa.timestamp("ms", tz="UTC"))])),
            ("x", pa.float64()),
        ]
    )
    us = 1_700_000_000_123_999
    raw64 = base64.b64encode(b"\x00\xff").decode()
    row = {
        "ts": dt.datetime(2023, 11, 14, 22, 13, 20, 123999, tzinfo=dt.timezone.utc),
        "day": dt.date(2022, 1, 2),
        "at": dt.time(1, 2, 3, 4000),
        "price": Decimal("12.30"),
        "raw": b"\x00\xff",
        "m": [("a", 1.5), ("b", None)],
        "tags": ["x", "é"],
        "nested": {"a": 3, "when": dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.timezone.utc)},
        "x": float("nan"),
    }
    put_parquet(store, s + ".parquet", [row, {**row, "m": [], "tags": None, "nested": None, "x": 2.0}], schema, "none")
    key_schema = pa.schema([("key", pa.struct([("id", pa.int64()), ("region", pa.string())]))])
    put_parquet(store, s + ".keys.parquet", [{"key": {"id": 7, "region": "eu"}}, {"key": None}], key_schema, "none")
    got = read_all(KafkaConnectSource(store, timestamp_field="ts")).to_pylist()
    assert got[0]["value"].decode() == (
        f'{{"ts":{us},"day":{(dt.date(2022, 1, 2) - dt.date(1970, 1, 1)).days},"at":3723004,"price":"12.30",'
        f'"raw":"{raw64}","m":{{"a":1.5,"b":null}},"tags":["x","é"],'
        '"nested":{"a":3,"when":1000},"x":"NaN"}'
    )
    assert json.loads(got[1]["value"])["m"] == {} and json.loads(got[1]["value"])["nested"] is None
    assert int(got[0]["timestamp"].timestamp() * 1000) == us // 1000
    assert [r["key"] for r in got] == [b'{"id":7,"region":"eu"}', None]


# --- the JSON reader's two paths agree -----------------------------------------------------------

_text = st.text(st.characters(codec="utf-8"), max_size=4)
_field_values = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(2**63, 2**64),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
)
_docs = st.one_of(
    st.none(),  # a tombstone
    st.fixed_dictionaries({"ts": _field_values}, optional={"k": st.one_of(_text, st.integers(-(2**70), 2**70))}),
    st.fixed_dictionaries({}, optional={"other": st.integers()}),
    _text,
)


def reference(docs: list, first: int) -> tuple[str, object]:
    """What json_values must give, from json.loads and the documented rules alone: records
    in order (a non-object value is a wrong option, a non-integer timestamp a corrupt
    record), then an option naming a field no value has is refused."""
    ts, keys = [], []
    for i, d in enumerate(docs):
        if d is not None and not isinstance(d, dict):
            return "OptionError", None
        t = None if d is None else d.get("ts")
        if t is not None and (type(t) is not int or not -(2**63) <= t < 2**63):
            return f"CorruptFile {first + i}", None
        ts.append(t)
        k = None if d is None else d.get("k")
        keys.append(None if k is None else (k.encode() if isinstance(k, str) else json.dumps(k).encode()))
    values = [d for d in docs if d is not None]
    for field, got in (("ts", ts), ("k", keys)):
        if values and all(x is None for x in got) and field not in values[0]:
            return "OptionError", None
    return "ok", (ts, keys)


@settings(max_examples=300, deadline=None)
@given(docs=st.lists(_docs, max_size=8), crlf=st.booleans())
def test_json_fast_path_equals_the_line_by_line_rules(docs, crlf):
    data = b"".join(jline(d) + (b"\r\n" if crlf else b"\n") for d in docs)
    want, result = reference(docs, 100)
    try:
        v = json_values(data, "f", 100, "ts", "k")
    except OptionError:
        assert want == "OptionError"
        return
    except CorruptFile as exc:
        assert want.startswith("CorruptFile") and f"offset {want.split()[-1]} " in str(exc)
        return
    assert want == "ok", want
    ts, keys = result
    assert v.timestamps.to_pylist() == ts
    assert v.values.to_pylist() == [None if d is None else jline(d) for d in docs]
    assert v.field_keys.to_pylist() == keys


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data,error,match",
    [
        (b'{"ts":1}\n{"ts":2,\n', CorruptFile, r"record at offset 1 is not JSON"),
        (b'{"ts":1}\n\n{"ts":2}\n', CorruptFile, r"line 2 is empty \(where the record at offset 1"),
        (b'{"ts":1}\n{"ts":"x"}\n', CorruptFile, r"record at offset 1 has 'ts' \(timestamp_field\) = \"x\""),
        (b'{"ts":1}\n{"ts":1.5}\n', CorruptFile, r"record at offset 1 has 'ts'.*not an integer"),
        (b'{"ts":1}\n{"t":1}\n', CorruptFile, r"record at offset 1 has a null 'ts'"),
        (b'{"t":1}\n', OptionError, r"timestamp_field 'ts' is in no JSON value .*fields: t"),
        (b'"text"\n', OptionError, r"needs JSON object values; the record at offset 0 is a str"),
    ],
)
def test_bad_json_is_named(local_url, data, error, match):
    store = fresh(local_url)
    key = stem(0, 0) + ".json"
    store.write(key, data)
    with pytest.raises(error, match=match) as err:
        read_all(KafkaConnectSource(store, timestamp_field="ts"))
    assert str(err.value).startswith(store.url_for(key) + ": ")


@pytest.mark.parametrize(
    "suffix", [".json.gz", ".keys.json.gz", ".snappy.parquet", ".keys.snappy.parquet", ".headers.snappy.parquet"]
)
def test_truncated_files_are_named(local_url, suffix):
    store = fresh(local_url)
    ext = ".json.gz" if "json" in suffix else ".snappy.parquet"
    write_files(store, make_records(0, 200), ext, per_file=200)
    key = stem(0, 0) + suffix
    data = store.read(key)
    store.write(key, data[: len(data) // 2])
    with pytest.raises(CorruptFile) as err:
        read_all(KafkaConnectSource(store, timestamp_field="ts"))
    assert str(err.value).startswith(store.url_for(key) + ": ")


@pytest.mark.parametrize("ext", [".json", ".snappy.parquet"])
def test_sibling_counts_and_shapes(local_url, ext):
    store = fresh(local_url)
    write_files(store, make_records(0, 6), ext, per_file=6)
    other = fresh(local_url)
    write_files(other, make_records(0, 4), ext, per_file=4)
    s = stem(0, 0)
    store.write(s + ".keys" + ext, other.read(s + ".keys" + ext))
    with pytest.raises(CorruptFile, match=r"holds 4 keys records, its value file .* holds 6.*offset 4") as err:
        read_all(KafkaConnectSource(store, timestamp_field="ts"))
    assert str(err.value).startswith(store.url_for(s + ".keys" + ext))
    store.delete(s + ".keys" + ext)
    store.write(s + ".headers" + ext, store.read(s + ext))  # a value file where headers belong
    with pytest.raises(CorruptFile, match="headers") as err:
        read_all(KafkaConnectSource(store, timestamp_field="ts"))
    assert str(err.value).startswith(store.url_for(s + ".headers" + ext))


def test_parquet_timestamp_field_checked(local_url):
    store = fresh(local_url)
    write_files(store, make_records(0, 3), ".snappy.parquet", per_file=3)
    with pytest.raises(OptionError, match=r"timestamp_field 'when' is not a field .*user, amount"):
        read_all(KafkaConnectSource(store, timestamp_field="when"))
    with pytest.raises(OptionError, match=r"timestamp_field 'currency' must be an integer"):
        read_all(KafkaConnectSource(store, timestamp_field="currency"))
    with pytest.raises(OptionError, match=r"key_field 'nobody' is not a field"):
        read_all(KafkaConnectSource(store, timestamp_field="ts", key_field="nobody"))


# --- records dropped by the connector ------------------------------------------------------------


@pytest.mark.parametrize("ext", [".avro", ".json", ".snappy.parquet"])
def test_thinned_files_are_refused_or_numbered_from_their_start(local_url, ext):
    """Files at 0 (3 records) and 5: two records of 0..4 were dropped (an ignored tombstone, a
    filtering SMT). Refused by default naming both files and the counts; allow_dropped
    numbers the file's records from its start; an overlap is refused either way."""
    store = fresh(local_url)
    recs = make_records(0, 8)
    kept = recs[:1] + recs[2:3] + recs[4:5] + recs[5:]  # offsets 1 and 3 dropped inside the first file
    for part, start in ((kept[:3], 0), (kept[3:], 5)):
        s = stem(0, start)
        if ext == ".avro":
            schema = {
                "type": "record",
                "name": "P",
                "fields": [
                    {"name": "user", "type": ["null", "string"]},
                    {"name": "amount", "type": "double"},
                    {"name": "merchant", "type": "string"},
                    {"name": "currency", "type": "string"},
                    {"name": "ts", "type": "long"},
                ],
            }
            put_avro(store, s + ext, schema, [r["value"] for r in part])
        else:
            write_files(
                store,
                [{**r, "offset": start + i} for i, r in enumerate(part)],
                ext,
                per_file=99,
                keys=False,
                headers=False,
            )
    first = stem(0, 0) + ext
    strict = KafkaConnectSource(store, timestamp_field="ts")
    with pytest.raises(ArchiveError) as err:
        read_all(strict)
    msg = str(err.value)
    assert msg.startswith(
        store.url_for(first) + ": holds 3 records, but the next file " + store.url_for(stem(0, 5) + ext)
    )
    assert "offsets 0..4 (5 records)" in msg and "2 were dropped" in msg and "--allow-dropped" in msg
    lenient = KafkaConnectSource(store, timestamp_field="ts", allow_dropped=True)
    got = read_all(lenient)
    assert got.column("offset").to_pylist() == [0, 1, 2, 5, 6, 7]
    assert [int(t.timestamp() * 1000) for t in got.column("timestamp").to_pylist()] == [r["ts"] for r in kept]
    # Seven records from offset 0 cannot end before the file at 5 starts.
    store.delete(first)
    longer = [{**r, "offset": i} for i, r in enumerate(recs[:7])]
    if ext == ".avro":
        put_avro(store, first, schema, [r["value"] for r in longer])
    else:
        write_files(store, longer, ext, per_file=99, keys=False, headers=False)
    with pytest.raises(
        ArchiveError, match=r"holds 7 records from offset 0, but the next file .* starts at offset 5.*overlap"
    ):
        read_all(lenient)


# --- end to end ------------------------------------------------------------------------------------


def test_json_and_parquet_archives_compact_verify_and_replay_exactly_once(spark, tmp_path, capsys):
    """A topic whose connector moved from JSON (gzip) to Parquet: partition 0 in .json.gz,
    partition 1 in .snappy.parquet then .json, one thinned file accepted with
    --allow-dropped. Compact, `keyfill verify`, replay: every source record exactly once,
    each key's records in offset order, the hand-off after each partition's last record."""
    from keyfill.cli import main

    root = tmp_path / "connect"
    store = open_storage(str(root))
    p0 = make_records(0, 300, seed=3)
    p1 = make_records(1, 260, first=5_000, seed=4)
    write_files(store, p0, ".json.gz", per_file=70)
    write_files(store, p1[:150], ".snappy.parquet", per_file=50)
    thinned = p1[150:160]  # one file of 10 records with 2 dropped: it holds 8, the next starts 10 later
    write_files(
        store,
        [{**r, "offset": thinned[0]["offset"] + i} for i, r in enumerate(thinned[:3] + thinned[5:])],
        ".json",
        per_file=99,
    )
    write_files(store, p1[160:], ".json", per_file=40)
    source = open_source(str(root), format="kafka-connect", options={"timestamp_field": "ts", "allow_dropped": True})
    want = {(c.partition, r["offset"]): r for c in source.list_chunks() for r in source.read(c).to_pylist()}
    assert len(want) == 300 + 258
    dest = str(tmp_path / "c")
    cfg = dict(
        source=str(root),
        dest=dest,
        source_format="kafka-connect",
        groups=3,
        slice_duration="500ms",
        seal_all=True,
    )
    with pytest.raises(Exception, match="2 were dropped"):  # from a Spark task
        compact(CompactConfig(**cfg, source_options={"timestamp_field": "ts"}), spark)
    r = compact(CompactConfig(**cfg, source_options={"timestamp_field": "ts", "allow_dropped": True}), spark)
    assert r.records == len(want)
    manifest = compacted.load_manifest(open_storage(dest))
    assert manifest.source.options["allow_dropped"] is True
    assert manifest.handoff == {0: 300, 1: 5_000 + 260}
    assert (
        main(
            [
                "verify",
                str(root),
                dest,
                "--format",
                "kafka-connect",
                "--timestamp-field",
                "ts",
                "--allow-dropped",
                "--json",
                "--no-progress",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["ok"] is True
    seen = []
    with reader.replay(dest, threads=3) as events:
        for ev in events:
            if isinstance(ev, reader.Records):
                seen += ev.batch.to_pylist()
    assert sorted((s["partition"], s["offset"]) for s in seen) == sorted(want)  # each record once
    for s in seen:
        w = want[(s["partition"], s["offset"])]
        assert (s["key"], s["value"], s["headers"], s["timestamp"]) == (
            w["key"],
            w["value"],
            w["headers"],
            w["timestamp"],
        )
    last: dict = {}
    for s in seen:
        assert s["offset"] > last.get((s["key"], s["partition"]), -1)
        last[(s["key"], s["partition"])] = s["offset"]


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.one_of(st.none(), _text, st.integers()), max_size=8), ascii_only=st.booleans())
def test_json_keys_plain_and_escaped_strings_read_alike(keys, ascii_only):
    """A key line is read unparsed when it has no escapes, else by json.loads: either way a
    string key is its UTF-8 text, null is null, a number keeps its bytes."""
    from compactor.sources.kafka_connect.json_lines import json_keys

    data = b"".join(json.dumps(k, ensure_ascii=ascii_only).encode() + b"\n" for k in keys)
    want = [None if k is None else k.encode() if isinstance(k, str) else str(k).encode() for k in keys]
    assert json_keys(data, "k", 0).to_pylist() == want
