"""The Kafka Connect S3 sink layout as a source, on both storage backends: round trips through
the writer, key/timestamp/value derivation, and bad input (errors that name the file)."""

from __future__ import annotations

import base64
import io
import json
import pickle
import uuid
from decimal import Decimal

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactor.errors import ArchiveError
from compactor.sources import open_source
from compactor.sources.kafka_connect import KafkaConnectSource
from keyfill.synth.kafka_connect import headers_schema, payment_schema, write_connect_archive
from keygroups.envelope import ARROW_SCHEMA, CorruptFile, batch_from_records
from keygroups.errors import OptionError
from keygroups.storage import open_storage

TOPIC = "payments"
T0 = 1_767_225_600_000
STEM = f"topics/{TOPIC}/partition=0/{TOPIC}+0+0000000000"


def payment(user: str | None, ts: int, amount: float = 12.5) -> bytes:
    return json.dumps({"user": user, "amount": amount, "merchant": "m-00001", "currency": "EUR", "ts": ts}).encode()


def records(partition: int, n: int, *, first: int = 0, seed: int = 0, tombstones: float = 0.0) -> list[dict]:
    """Envelope records of payments; keys null in one of five, header values null sometimes."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        user = None if rng.random() < 0.2 else f"user-{rng.integers(0, 9)}"
        ts = T0 + 10 * i - int(rng.integers(0, 30))
        tomb = i > 0 and rng.random() < tombstones
        out.append(
            {
                "partition": partition,
                "offset": first + i,
                "timestamp": ts,
                "key": user.encode() if user else None,
                "value": None if tomb else payment(user, ts, float(rng.integers(100, 99999)) / 100),
                "headers": [{"key": "trace-id", "value": b"%016x" % i}]
                + ([{"key": "src", "value": None}] if i % 3 else []),
            }
        )
    return out


def fresh(storage_url: str):
    store = open_storage(storage_url).sub(f"case-{uuid.uuid4().hex[:10]}")
    store.delete_prefix("")
    return store


def read_all(src: KafkaConnectSource) -> pa.Table:
    return pa.Table.from_batches([src.read(c) for c in src.list_chunks()], schema=ARROW_SCHEMA)


def put_avro(store, key: str, schema, recs: list, codec: str = "null") -> None:
    out = io.BytesIO()
    fastavro.writer(out, fastavro.parse_schema(schema), recs, codec=codec)
    store.write(key, out.getvalue())


def assert_same(got: pa.Table, want: list[dict], *, ts_scale: int = 1) -> None:
    """Same records; values compared as decoded payments (amounts may be respelled, `ts`
    is in the unit of the value schema)."""
    got_rows = got.to_pylist()
    assert len(got_rows) == len(want)
    for g, w in zip(got_rows, want):
        assert (g["partition"], g["offset"], g["key"], g["headers"]) == (
            w["partition"],
            w["offset"],
            w["key"],
            w["headers"],
        )
        if w["value"] is None:
            assert g["value"] is None
        else:
            doc = json.loads(w["value"])
            doc["ts"] *= ts_scale
            assert json.loads(g["value"]) == doc
            assert int(g["timestamp"].timestamp() * 1000) == w["timestamp"]


# --- round trips ----------------------------------------------------------------------


def test_generated_archive_round_trip(storage_url):
    """`keyfill generate` output -> Connect layout -> the same envelope records, with the
    root at the folder holding topics/ or at topics/ itself."""
    from keyfill.synth.generate import GeneratorConfig, generate

    store = open_storage(storage_url)
    generate(
        GeneratorConfig(
            out=f"{storage_url}/env",
            records=6000,
            partitions=3,
            headers=True,
            chunk_records=1500,
            null_keys=0.05,
            threads=2,
        ),
        progress=False,
    )
    env = open_source(f"{storage_url}/env")
    want = pa.Table.from_batches([env.read(c) for c in env.list_chunks()])
    write_connect_archive(env, store.sub("connect"), records_per_file=700)

    src = open_source(f"{storage_url}/connect", format="kafka-connect", options={"timestamp_field": "ts"})
    chunks = src.list_chunks()
    assert [(c.partition, c.first_offset) for c in chunks] == sorted((c.partition, c.first_offset) for c in chunks)
    assert all(c.key.startswith("topics/payments/partition=") and c.last_offset is None for c in chunks)
    got = read_all(src)
    for col in ("partition", "offset", "timestamp", "key", "headers"):
        assert got.column(col).equals(want.column(col)), col
    assert [json.loads(v) for v in got.column("value").to_pylist()] == [
        json.loads(v) for v in want.column("value").to_pylist()
    ]
    inner = KafkaConnectSource(store.sub("connect/topics"), timestamp_field="ts")
    assert [c.key for c in inner.list_chunks()] == [c.key.removeprefix("topics/") for c in chunks]
    assert read_all(inner).equals(got)


def test_list_chunks_from_a_listing_only(storage_url):
    store = fresh(storage_url)
    recs = records(0, 25) + records(1, 5)
    write_connect_archive([batch_from_records(recs)], store, topic=TOPIC, records_per_file=4, pad=1)
    src = KafkaConnectSource(store, timestamp_field="ts")

    def no_reads(*a, **k):
        raise AssertionError("list_chunks read an object")

    store.read = store.read_range = no_reads
    chunks = src.list_chunks()
    assert [(c.partition, c.first_offset) for c in chunks] == [(0, s) for s in range(0, 25, 4)] + [(1, 0), (1, 4)]
    assert chunks[3].key == f"topics/{TOPIC}/partition=0/{TOPIC}+0+12.avro"  # 9 < 12, numeric order
    assert all(c.topic == TOPIC and c.size > 0 and c.records is None and c.max_timestamp is None for c in chunks)


@pytest.mark.parametrize("pad", [3, 20])
def test_any_offset_width(storage_url, pad):
    store = fresh(storage_url)
    want = records(0, 12, first=990)
    write_connect_archive([batch_from_records(want)], store, topic=TOPIC, records_per_file=5, pad=pad)
    src = KafkaConnectSource(store, timestamp_field="ts")
    assert [c.first_offset for c in src.list_chunks()] == [990, 995, 1000]
    assert_same(read_all(src), want)


def test_pickled_source_reads(storage_url):
    store = fresh(storage_url)
    write_connect_archive([batch_from_records(records(0, 10))], store, topic=TOPIC)
    src = KafkaConnectSource(store, key_field="user", timestamp_field="ts")
    chunk = src.list_chunks()[0]
    copy = pickle.loads(pickle.dumps(src))
    assert copy.read(chunk).equals(src.read(chunk))


# --- keys, timestamps, values -------------------------------------------------------------


def test_key_from_keys_file_or_value_field(storage_url):
    store = fresh(storage_url)
    want = records(0, 30, seed=3)
    batch = batch_from_records(want)
    write_connect_archive([batch], store.sub("with"), topic=TOPIC, records_per_file=8)
    write_connect_archive([batch], store.sub("without"), topic=TOPIC, records_per_file=8, with_keys=False)
    keys = [r["key"] for r in want]
    assert keys.count(None) > 0
    # The keys file wins over key_field; without it the field gives the key, else null.
    from_file = read_all(KafkaConnectSource(store.sub("with"), key_field="merchant", timestamp_field="ts"))
    from_field = read_all(KafkaConnectSource(store.sub("without"), key_field="user", timestamp_field="ts"))
    no_key = read_all(KafkaConnectSource(store.sub("without"), timestamp_field="ts"))
    assert from_file.column("key").to_pylist() == keys
    assert from_field.column("key").to_pylist() == keys
    assert no_key.column("key").null_count == len(want)


@pytest.mark.parametrize("ts_type", ["long", "timestamp-millis", "timestamp-micros"])
def test_timestamp_units(storage_url, ts_type):
    store = fresh(storage_url)
    want = records(0, 20, seed=5)
    write_connect_archive(
        [batch_from_records(want)], store, topic=TOPIC, records_per_file=7, value_schema=payment_schema(ts_type)
    )
    schema = json.loads(fastavro.reader(io.BytesIO(store.read(STEM + ".avro"))).metadata["avro.schema"])
    want_type = "long" if ts_type == "long" else {"type": "long", "logicalType": ts_type}
    assert schema["fields"][-1]["type"] == want_type
    got = read_all(KafkaConnectSource(store, timestamp_field="ts"))
    assert_same(got, want, ts_scale=1000 if ts_type == "timestamp-micros" else 1)


def test_sub_millisecond_timestamps_floor(storage_url):
    store = fresh(storage_url)
    schema = {
        "type": "record",
        "name": "E",
        "fields": [
            {"name": "us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "ns", "type": {"type": "long", "logicalType": "timestamp-nanos"}},
            {"name": "ms", "type": "int"},
        ],
    }
    us = [1_700_000_000_123_999, -1, 5]
    put_avro(store, STEM + ".avro", schema, [{"us": u, "ns": u * 1000 + 999, "ms": 7} for u in us])
    for field in ("us", "ns"):
        got = read_all(KafkaConnectSource(store, timestamp_field=field)).column("timestamp").cast(pa.int64())
        assert got.to_pylist() == [1_700_000_000_123, -1, 0]
    got = read_all(KafkaConnectSource(store, timestamp_field="ms")).column("timestamp").cast(pa.int64())
    assert got.to_pylist() == [7] * 3
    # The value keeps the raw Avro longs of the logical types, not rounded datetimes.
    assert json.loads(read_all(KafkaConnectSource(store, timestamp_field="us")).column("value")[0].as_py()) == {
        "us": us[0],
        "ns": us[0] * 1000 + 999,
        "ms": 7,
    }


def test_null_keys_and_tombstones(storage_url):
    store = fresh(storage_url)
    ts = [None, 50, None, None, 90, None]
    recs = [
        {
            "partition": 0,
            "offset": i,
            "timestamp": t or 0,
            "key": None if i % 2 else b"k%d" % i,
            "value": None if t is None else payment(None, t),
            "headers": [],
        }
        for i, t in enumerate(ts)
    ]
    write_connect_archive([batch_from_records(recs)], store, topic=TOPIC)
    schema = json.loads(fastavro.reader(io.BytesIO(store.read(STEM + ".avro"))).metadata["avro.schema"])
    assert schema[0] == "null"  # a file holding tombstones gets a nullable value schema
    got = read_all(KafkaConnectSource(store, key_field="user", timestamp_field="ts"))
    # A tombstone takes the timestamp of the record before it (after it when it leads).
    assert got.column("timestamp").cast(pa.int64()).to_pylist() == [50, 50, 50, 50, 90, 90]
    assert [v is None for v in got.column("value").to_pylist()] == [t is None for t in ts]
    assert got.column("key").to_pylist() == [r["key"] for r in recs]


def test_only_tombstones_cannot_be_dated(storage_url):
    store = fresh(storage_url)
    put_avro(store, STEM + ".avro", ["null", payment_schema()], [None, None])
    with pytest.raises(CorruptFile, match=r"only tombstones.*timestamp_field") as err:
        read_all(KafkaConnectSource(store, timestamp_field="ts"))
    assert store.url_for(STEM + ".avro") in str(err.value)


def test_value_encoding(storage_url):
    """Values become compact JSON: bytes as base64, decimals as exact strings, logical types
    as their Avro value, unions unwrapped, NaN as a string; keys of any type per the rule."""
    store = fresh(storage_url)
    schema = {
        "type": "record",
        "name": "V",
        "fields": [
            {"name": "ts", "type": "long"},
            {"name": "raw", "type": "bytes"},
            {"name": "fix", "type": {"type": "fixed", "name": "F", "size": 2}},
            {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["A", "B"]}},
            {
                "name": "nested",
                "type": [
                    "null",
                    {
                        "type": "record",
                        "name": "N",
                        "fields": [
                            {"name": "tags", "type": {"type": "array", "items": "string"}},
                            {"name": "m", "type": {"type": "map", "values": "double"}},
                        ],
                    },
                ],
            },
            {"name": "x", "type": "double"},
            {"name": "n", "type": "long"},
            {"name": "text", "type": "string"},
        ],
    }
    rec = {
        "ts": 1,
        "raw": b"\x00\xff",
        "fix": b"ab",
        "price": Decimal("12.30"),
        "day": 19000,
        "id": "6f1c5a52-3b8e-4a57-9b53-9f8a4e1d2c3b",
        "kind": "B",
        "nested": {"tags": ["x", "é"], "m": {"a": 1.5}},
        "x": float("nan"),
        "n": 42,
        "text": "héllo",
    }
    put_avro(store, STEM + ".avro", schema, [rec, {**rec, "nested": None, "x": float("-inf")}])
    values = read_all(KafkaConnectSource(store, timestamp_field="ts")).column("value").to_pylist()
    assert values[0].decode() == (
        '{"ts":1,"raw":"AP8=","fix":"YWI=","price":"12.30","day":19000,'
        '"id":"6f1c5a52-3b8e-4a57-9b53-9f8a4e1d2c3b","kind":"B","nested":{"tags":["x","é"],"m":{"a":1.5}},'
        '"x":"NaN","n":42,"text":"héllo"}'
    )
    assert json.loads(values[1])["nested"] is None and json.loads(values[1])["x"] == "-Infinity"
    keys = {
        f: read_all(KafkaConnectSource(store, key_field=f, timestamp_field="ts")).column("key")[0].as_py()
        for f in ("text", "raw", "n", "nested", "price")
    }
    assert keys == {
        "text": "héllo".encode(),
        "raw": b"\x00\xff",
        "n": b"42",
        "nested": '{"tags":["x","é"],"m":{"a":1.5}}'.encode(),
        "price": b'"12.30"',
    }


def test_other_keys_and_headers_shapes(storage_url):
    """Record keys (Debezium-style) become JSON; enveloped RecordKey / RecordHeaders files
    (newer connectors) are unwrapped; bytes header values stay bytes."""
    store = fresh(storage_url)
    put_avro(store, STEM + ".avro", payment_schema(), [json.loads(payment("u", T0 + i)) for i in range(3)])
    key_schema = {"type": "record", "name": "Key", "fields": [{"name": "id", "type": "long"}]}
    put_avro(store, STEM + ".keys.avro", key_schema, [{"id": i} for i in range(3)])
    item = {
        "type": "record",
        "name": "H",
        "fields": [{"name": "key", "type": "string"}, {"name": "value", "type": ["null", "bytes"]}],
    }
    enveloped = {
        "type": "record",
        "name": "RecordHeaders",
        "fields": [{"name": "headers", "type": {"type": "array", "items": item}}],
    }
    headers = [[{"key": "a", "value": b"\xff"}], [], [{"key": "b", "value": None}]]
    put_avro(store, STEM + ".headers.avro", enveloped, [{"headers": h} for h in headers])
    got = read_all(KafkaConnectSource(store, timestamp_field="ts"))
    assert got.column("key").to_pylist() == [b'{"id":0}', b'{"id":1}', b'{"id":2}']
    assert got.column("headers").to_pylist() == headers
    put_avro(
        store,
        STEM + ".keys.avro",
        {"type": "record", "name": "RecordKey", "fields": [{"name": "key", "type": ["null", "string"]}]},
        [{"key": "x"}, {"key": None}, {"key": "z"}],
    )
    assert read_all(KafkaConnectSource(store, timestamp_field="ts")).column("key").to_pylist() == [b"x", None, b"z"]


def test_writer_writes_the_connector_shapes(storage_url):
    store = fresh(storage_url)
    recs = records(0, 4)
    for r in recs:
        r["headers"] = [h for h in r["headers"] if h["value"] is not None]
    write_connect_archive([batch_from_records(recs)], store, topic=TOPIC)
    meta = {
        s: json.loads(fastavro.reader(io.BytesIO(store.read(STEM + s))).metadata["avro.schema"])
        for s in (".avro", ".keys.avro", ".headers.avro")
    }
    assert meta[".keys.avro"] == ["null", "string"]
    items = meta[".headers.avro"]["items"]
    assert meta[".headers.avro"]["type"] == "array" and items["name"].endswith("ConnectDefault")
    assert [(f["name"], f["type"]) for f in items["fields"]] == [("key", "string"), ("value", "string")]
    assert headers_schema(True)["items"]["fields"][1]["type"] == ["null", "string"]
    assert meta[".avro"]["name"] == "keyfill.example.Payment"


# --- missing pieces and bad input -----------------------------------------------------------


def test_missing_headers_files(storage_url):
    store = fresh(storage_url)
    want = records(0, 12, seed=1)
    write_connect_archive([batch_from_records(want)], store, topic=TOPIC, records_per_file=5)
    store.delete(STEM + ".headers.avro")  # one file lost its headers, the others keep theirs
    got = read_all(KafkaConnectSource(store, timestamp_field="ts")).column("headers").to_pylist()
    assert got == [[]] * 5 + [r["headers"] for r in want[5:]]
    bare = fresh(storage_url)
    write_connect_archive([batch_from_records(want)], bare, topic=TOPIC, records_per_file=5, with_headers=False)
    assert read_all(KafkaConnectSource(bare, timestamp_field="ts")).column("headers").to_pylist() == [[]] * 12


def test_options_are_checked_by_the_format_and_an_append_keeps_the_archives():
    from compactor.config import CompactConfig
    from compactor.sources.kafka_connect import KafkaConnectOptions

    cfg = CompactConfig(source="s", dest="d", source_format="kafka-connect", source_options={"timestamp_field": "ts"})
    assert cfg.source_options == KafkaConnectOptions(timestamp_field="ts")
    with pytest.raises(OptionError, match=r"--allow-dropped \(allow_dropped\): 'yes' is not bool"):
        CompactConfig(source="s", dest="d", source_format="kafka-connect", source_options={"allow_dropped": "yes"})
    with pytest.raises(OptionError, match=r"--key-field \(key_field\) is an option of --format kafka-connect; "):
        CompactConfig(source="s", dest="d", source_options={"key_field": "user"})
    with pytest.raises(OptionError, match=r"unknown source option 'ts_field'; --format kafka-connect takes --time"):
        open_source("s", format="kafka-connect", options={"ts_field": "ts"})
    recorded = {"url": "s", "format": "kafka-connect", "timestamp_field": "t", "key_field": "k", "allow_dropped": True}
    given = KafkaConnectOptions(timestamp_field="ts", key_field="user")
    assert given.continued(recorded) == KafkaConnectOptions(timestamp_field="t", key_field="k", allow_dropped=True)
    recorded["allow_dropped"] = False
    assert KafkaConnectOptions("ts", allow_dropped=True).continued(recorded).allow_dropped  # this run's, too


def test_timestamp_field_is_required_and_must_exist(storage_url):
    store = fresh(storage_url)
    write_connect_archive([batch_from_records(records(0, 3))], store, topic=TOPIC)
    for make in (lambda: KafkaConnectSource(store), lambda: open_source(store.url, format="kafka-connect")):
        with pytest.raises(OptionError, match=r"timestamp_field \(--timestamp-field\)"):
            make()
    src = KafkaConnectSource(store, timestamp_field="event_time")
    with pytest.raises(OptionError, match=r"timestamp_field 'event_time' is not a field") as err:
        src.read(src.list_chunks()[0])
    assert store.url_for(STEM + ".avro") in str(err.value)
    src = KafkaConnectSource(store, timestamp_field="ts", key_field="customer")
    with pytest.raises(OptionError, match=r"key_field 'customer' is not a field.*user, amount"):
        src.read(src.list_chunks()[0])
    src = KafkaConnectSource(store, timestamp_field="currency")
    with pytest.raises(OptionError, match=r"timestamp_field 'currency' must be an int/long"):
        src.read(src.list_chunks()[0])


def test_null_timestamp_in_a_record_names_the_offset(storage_url):
    store = fresh(storage_url)
    schema = {"type": "record", "name": "E", "fields": [{"name": "ts", "type": ["null", "long"]}]}
    put_avro(store, f"topics/{TOPIC}/partition=0/{TOPIC}+0+0000000040.avro", schema, [{"ts": 1}, {"ts": None}])
    with pytest.raises(CorruptFile, match=r"0000000040.avro: record at offset 41 has a null 'ts'"):
        read_all(KafkaConnectSource(store, timestamp_field="ts"))


@pytest.mark.parametrize("sibling", [".keys.avro", ".headers.avro"])
def test_count_mismatch_names_the_file(storage_url, sibling):
    store = fresh(storage_url)
    write_connect_archive([batch_from_records(records(0, 10))], store, topic=TOPIC)
    other = fresh(storage_url)
    write_connect_archive([batch_from_records(records(0, 7))], other, topic=TOPIC)
    store.write(STEM + sibling, other.read(STEM + sibling))
    src = KafkaConnectSource(store, timestamp_field="ts")
    with pytest.raises(CorruptFile, match=r"holds 7 .* holds 10.*offset 7") as err:
        src.read(src.list_chunks()[0])
    assert str(err.value).startswith(store.url_for(STEM + sibling))


@pytest.mark.parametrize("suffix", [".avro", ".keys.avro", ".headers.avro"])
@pytest.mark.parametrize("codec", ["null", "deflate"])
def test_truncated_file_is_corrupt(storage_url, suffix, codec):
    store = fresh(storage_url)
    batch = batch_from_records(records(0, 300))
    write_connect_archive([batch], store, topic=TOPIC, records_per_file=300, codec=codec)
    data = store.read(STEM + suffix)
    store.write(STEM + suffix, data[: len(data) - 40])
    src = KafkaConnectSource(store, timestamp_field="ts")
    with pytest.raises(CorruptFile) as err:
        src.read(src.list_chunks()[0])
    assert str(err.value).startswith(store.url_for(STEM + suffix) + ": ")
    store.write(STEM + suffix, b"Obj\x01" + data[4:60])
    with pytest.raises(CorruptFile, match="not a readable Avro|truncated"):
        src.read(src.list_chunks()[0])


def test_duplicate_start_offsets_name_both(storage_url):
    store = fresh(storage_url)
    write_connect_archive([batch_from_records(records(0, 3))], store, topic=TOPIC, pad=10)
    write_connect_archive(
        [batch_from_records(records(0, 3))], store, topic=TOPIC, pad=4, with_keys=False, with_headers=False
    )
    with pytest.raises(ArchiveError, match="two value files of payments partition 0 start at offset 0") as err:
        KafkaConnectSource(store, timestamp_field="ts").list_chunks()
    assert store.url_for(STEM + ".avro") in str(err.value)
    assert store.url_for(f"topics/{TOPIC}/partition=0/{TOPIC}+0+0000.avro") in str(err.value)


def test_names_outside_the_layout(storage_url):
    store = fresh(storage_url)
    write_connect_archive([batch_from_records(records(0, 3))], store, topic=TOPIC)
    src = KafkaConnectSource(store, timestamp_field="ts")
    store.write("elsewhere/ignored.avro", b"x")  # outside topics/: not ours
    assert len(src.list_chunks()) == 1
    for bad, why in [
        (f"topics/{TOPIC}/partition=1/{TOPIC}+0+0000000005.avro", "its folder says topic payments partition 1"),
        (f"topics/{TOPIC}/partition=0/{TOPIC}+0+0000000009.keys.avro", "has no value file"),
        (f"topics/{TOPIC}/year=2026/{TOPIC}+0+0000000009.avro", "only the default partitioner"),
    ]:
        store.write(bad, b"x")
        with pytest.raises(ArchiveError, match=why) as err:
            src.list_chunks()
        assert store.url_for(bad) in str(err.value)
        store.delete(bad)
    with pytest.raises(ArchiveError, match="no Kafka Connect value files"):
        KafkaConnectSource(fresh(storage_url), timestamp_field="ts").list_chunks()


# --- property: any records, any file split --------------------------------------------------

_text = st.text(st.characters(codec="utf-8"), max_size=6)


@st.composite
def archives(draw):
    key_type = draw(st.sampled_from(["string", "bytes"]))
    key_st = _text.map(str.encode) if key_type == "string" else st.binary(max_size=6)
    per_file = draw(st.integers(2, 6))
    parts = []
    for p in range(draw(st.integers(1, 3))):
        offset = draw(st.integers(0, 10**12))
        recs, in_file = [], 0
        for i in range(draw(st.integers(1, 14))):
            gap = draw(st.sampled_from([0, 0, 0, 0, 3]))
            offset += gap
            starts_file = i == 0 or gap > 0 or in_file == per_file
            in_file = 1 if starts_file else in_file + 1
            ts = draw(st.integers(T0 - 10**6, T0 + 10**6))
            tomb = not starts_file and draw(st.booleans())  # every file keeps a datable record
            recs.append(
                {
                    "partition": p,
                    "offset": offset,
                    "timestamp": ts,
                    "key": draw(st.none() | key_st),
                    "value": None if tomb else payment(draw(st.none() | _text), ts, draw(st.floats(-1e9, 1e9))),
                    "headers": draw(
                        st.lists(
                            st.fixed_dictionaries({"key": _text, "value": st.none() | _text.map(str.encode)}),
                            max_size=3,
                        )
                    ),
                }
            )
            offset += 1
        parts.append(recs)
    return key_type, per_file, parts


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=archives(), with_keys=st.booleans(), with_headers=st.booleans(), pad=st.integers(1, 13))
def test_property_round_trip(storage_url, case, with_keys, with_headers, pad):
    key_type, per_file, parts = case
    store = fresh(storage_url)
    batches = [batch_from_records(recs) for recs in parts]
    write_connect_archive(
        batches,
        store,
        topic=TOPIC,
        records_per_file=per_file,
        pad=pad,
        key_type=key_type,
        with_keys=with_keys,
        with_headers=with_headers,
    )
    kf = None if with_keys else "user"
    # Files are cut at offset gaps, so the file before a gap looks thinned by the connector:
    # refused by default, read from its start offset with allow_dropped.
    src = KafkaConnectSource(store, key_field=kf, timestamp_field="ts", allow_dropped=True)
    strict = KafkaConnectSource(store, key_field=kf, timestamp_field="ts")
    chunks = src.list_chunks()
    got = [src.read(c) for c in chunks]
    for c, b in zip(chunks, got):
        if c.next_offset is not None and c.next_offset != c.first_offset + b.num_rows:
            with pytest.raises(ArchiveError, match=f"holds {b.num_rows} records, but the next file"):
                strict.read(c)
        else:
            assert strict.read(c).equals(b)
    for c, b in zip(chunks, got):
        offsets = b.column("offset").to_numpy()
        assert offsets[0] == c.first_offset and (np.diff(offsets) == 1).all()
    want = [r for recs in parts for r in recs]
    rows = pa.Table.from_batches(got, schema=ARROW_SCHEMA).to_pylist()
    assert [(r["partition"], r["offset"]) for r in rows] == [(w["partition"], w["offset"]) for w in want]
    for g, w in zip(rows, want):
        assert g["headers"] == (w["headers"] if with_headers else [])
        if with_keys:
            assert g["key"] == w["key"]
        else:  # from the value's user field; tombstones have none
            assert g["key"] == (None if w["value"] is None else _user_key(w["value"]))
        if w["value"] is None:
            assert g["value"] is None
        else:
            assert json.loads(g["value"]) == json.loads(w["value"])
            assert int(g["timestamp"].timestamp() * 1000) == w["timestamp"]
    # Tombstones carry the timestamp of the record before them in their file.
    for b in got:
        ts = b.column("timestamp").cast(pa.int64()).to_pylist()
        for i, v in enumerate(b.column("value").to_pylist()):
            if v is None:
                assert ts[i] == ts[i - 1]


def _user_key(value: bytes) -> bytes | None:
    user = json.loads(value)["user"]
    return None if user is None else user.encode()


def test_base64_is_what_connect_json_would_write():
    """Sanity of the bytes rule against the standard library's base64 (no padding games)."""
    from compactor.sources.kafka_connect.avro import encode_json

    assert encode_json({"b": b"\x00\x01\xfe"}) == '{"b":"' + base64.b64encode(b"\x00\x01\xfe").decode() + '"}'


@pytest.mark.parametrize("codec", ["null", "deflate", "snappy", "bzip2", "xz"])
def test_keys_files_of_every_codec_decode_in_the_compiled_path(codec):
    """The connector may compress with any codec of the Avro spec (avro.codec)."""
    from compactor.sources.kafka_connect.avro_keys_headers import fast_keys

    keys = ["a", None, "bé", ""] * 40
    out = io.BytesIO()
    fastavro.writer(out, fastavro.parse_schema(["null", "string"]), keys, codec=codec, sync_interval=64)
    got = fast_keys(out.getvalue(), f"k.{codec}.avro", 0, 0)
    assert got.to_pylist() == [None if k is None else k.encode() for k in keys]


@pytest.mark.parametrize("ext", ["avro", "json"])
def test_a_connect_archive_read_with_another_format_names_the_format_it_is(local_url, ext):
    """The default format over a Connect archive, and Connect over an envelope archive or a
    broker's log directory: the error says which --format the files are laid out like."""
    store = fresh(local_url)
    write_connect_archive([batch_from_records(records(0, 8))], store.sub("c"), topic=TOPIC, records_per_file=4)
    if ext == "json":  # no .avro file at all: the default format finds no chunk
        for o in store.list():
            if o.key.endswith(".avro"):
                store.write(o.key[: -len(".avro")] + ".json", b"{}\n")
                store.delete(o.key)
    with pytest.raises(ArchiveError, match="laid out like --format kafka-connect"):
        open_source(f"{store.url}/c").list_chunks()
    from compactor.sources.envelope import write_chunk

    write_chunk(store.sub("e"), batch_from_records(records(0, 3)), TOPIC)
    with pytest.raises(ArchiveError, match="laid out like --format envelope"):
        open_source(f"{store.url}/e", format="kafka-connect", options={"timestamp_field": "ts"}).list_chunks()
    store.write(f"k/{TOPIC}-0/{0:020d}.log", b"")
    with pytest.raises(ArchiveError, match="laid out like --format kafka-segments"):
        open_source(f"{store.url}/k", format="kafka-connect", options={"timestamp_field": "ts"}).list_chunks()
    with pytest.raises(ArchiveError, match="laid out like --format kafka-connect"):
        open_source(f"{store.url}/c", format="kafka-segments").list_chunks()
