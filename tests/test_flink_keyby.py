"""reader.partition_batches routes keys exactly as Flink's keyBy does.

The oracles below transcribe the Java definitions literally, in pure Python with explicit
32-bit wraparound: String.hashCode over UTF-16 code units, Arrays.hashCode(byte[]),
Flink's MathUtils.murmurHash(int), and KeyGroupRangeAssignment's key group and operator
index. The oracles are pinned by published MurmurHash3 reference vectors and by values
computed on a JVM; `test_matches_a_real_jvm` compiles and runs a Java transcription when
a JDK is present.
"""

from __future__ import annotations

import codecs
import itertools
import random
import shutil
import subprocess

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keygroups.envelope import ARROW_SCHEMA
from keygroups.errors import KeyfillError, OptionError
from reader.errors import NotARecordBatch, RoutingError
from reader.flink_keyby import (
    _bytes_hash,
    _flink_murmur,
    _string_hash,
    consumer_indexes,
    flink_default_max_parallelism,
    partition_batches,
)

MAX_PARALLELISMS = (128, 4096, 32768)
HEADERS = ARROW_SCHEMA.field("headers").type
MASK = 0xFFFFFFFF
INT_MIN = -(1 << 31)
MANY = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOME = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- Java oracles


def java_int(x: int) -> int:
    """(int) x: keep the low 32 bits, two's complement."""
    x &= MASK
    return x - (1 << 32) if x >= 1 << 31 else x


def java_div(a: int, b: int) -> int:
    """Java's int `/`: truncates toward zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def java_rem(a: int, b: int) -> int:
    """Java's int `%`: the sign follows the dividend."""
    return a - b * java_div(a, b)


def unsigned_shift_right(x: int, n: int) -> int:
    """x >>> n."""
    return (x & MASK) >> n


def rotate_left(x: int, n: int) -> int:
    """Integer.rotateLeft."""
    return java_int((x << n) | unsigned_shift_right(x, 32 - n))


def string_hash_code(s: str) -> int:
    """String.hashCode: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units."""
    units = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = java_int(31 * h + int.from_bytes(units[i : i + 2], "big"))
    return h


def arrays_hash_code(data: bytes) -> int:
    """java.util.Arrays.hashCode(byte[]): starts at 1, bytes are signed."""
    h = 1
    for b in data:
        h = java_int(31 * h + (b - 256 if b >= 128 else b))
    return h


def bit_mix(x: int) -> int:
    """MathUtils.bitMix (MurmurHash3's 32-bit finaliser)."""
    x ^= unsigned_shift_right(x, 16)
    x = java_int(x * 0x85EBCA6B)
    x ^= unsigned_shift_right(x, 13)
    x = java_int(x * 0xC2B2AE35)
    x ^= unsigned_shift_right(x, 16)
    return x


def murmur_hash(code: int) -> int:
    """MathUtils.murmurHash(int)."""
    code = java_int(code * 0xCC9E2D51)
    code = rotate_left(code, 15)
    code = java_int(code * 0x1B873593)
    code = rotate_left(code, 13)
    code = java_int(code * 5 + 0xE6546B64)
    code ^= 4
    code = bit_mix(code)
    if code >= 0:
        return code
    elif code != INT_MIN:
        return -code
    else:
        return 0


def assign_key_to_parallel_operator(hash_code: int, max_parallelism: int, parallelism: int) -> int:
    """KeyGroupRangeAssignment.assignKeyToParallelOperator, given key.hashCode()."""
    key_group = java_rem(murmur_hash(hash_code), max_parallelism)  # computeKeyGroupForKeyHash
    return java_div(java_int(key_group * parallelism), max_parallelism)  # computeOperatorIndexForKeyGroup


def _java_utf8_errors(err: UnicodeDecodeError) -> tuple[str, int]:
    """`new String(bytes, UTF_8)` replaces like CPython (one U+FFFD per maximal valid
    prefix) except for ED A0..BF: the JDK reads it as a 3-byte (surrogate) sequence and
    replaces the whole of it, or of its truncated prefix, with one U+FFFD."""
    data, start = err.object, err.start
    if data[start] == 0xED and start + 1 < len(data) and 0xA0 <= data[start + 1] <= 0xBF:
        end = start + 2
        if end < len(data) and 0x80 <= data[end] <= 0xBF:
            end += 1
        return "\ufffd", end
    return "\ufffd", err.end


codecs.register_error("keyfill-test-java-utf8", _java_utf8_errors)


def java_string(data: bytes) -> str:
    """new String(data, StandardCharsets.UTF_8)."""
    return data.decode("utf-8", "keyfill-test-java-utf8")


def expected_consumer(key: bytes | None, partition: int, max_p: int, d: int, key_type: str) -> int:
    if key is None:
        code = partition  # Integer.hashCode
    elif key_type == "string":
        code = string_hash_code(java_string(key))
    else:
        code = arrays_hash_code(key)
    return assign_key_to_parallel_operator(code, max_p, d)


# ----------------------------------------------------------------------------- helpers


def make_batch(keys: list[bytes | None], partitions: list[int] | None = None) -> pa.RecordBatch:
    """Envelope columns plus an extra key_group column; offsets are unique row ids."""
    n = len(keys)
    partitions = partitions if partitions is not None else [i % 5 for i in range(n)]
    cols = [
        pa.array(partitions, pa.int32()),
        pa.array(range(n), pa.int64()),
        pa.array([1_700_000_000_000 + i for i in range(n)], pa.timestamp("ms", tz="UTC")),
        pa.array(keys, pa.binary()),
        pa.array([b"v%d" % i for i in range(n)], pa.binary()),
        pa.array([[{"key": "h", "value": b"%d" % i}] if i % 3 == 0 else [] for i in range(n)], HEADERS),
        pa.array([i % 7 for i in range(n)], pa.int32()),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=ARROW_SCHEMA.append(pa.field("key_group", pa.int32())))


utf8_keys = st.text(max_size=24).map(lambda s: s.encode("utf-8"))  # any code point, incl. non-BMP
malformed_bytes = st.lists(
    st.sampled_from(
        [
            0x41,
            0x80,
            0x8F,
            0x90,
            0x9F,
            0xA0,
            0xBF,
            0xC0,
            0xC1,
            0xC2,
            0xDF,
            0xE0,
            0xE1,
            0xED,
            0xEF,
            0xF0,
            0xF1,
            0xF4,
            0xF5,
            0xFF,
        ]
    )
    | st.integers(0, 255),
    max_size=12,
).map(bytes)
any_key = st.one_of(utf8_keys, st.binary(max_size=24), malformed_bytes, st.none())


@st.composite
def parallelism(draw: st.DrawFn, most_consumers: int = 32768) -> tuple[int, int]:
    max_p = draw(st.sampled_from(MAX_PARALLELISMS) | st.integers(1, 32768))
    top = min(max_p, most_consumers)
    d = draw(st.integers(1, min(top, 128)) | st.integers(1, top) | st.sampled_from([1, top]))
    return max_p, d


@st.composite
def keyed_rows(draw: st.DrawFn, keys: st.SearchStrategy = any_key) -> tuple[list, list[int]]:
    """Rows over a small key pool, so keys repeat and per-key order means something."""
    pool = draw(st.lists(keys, min_size=1, max_size=12))
    picks = draw(st.lists(st.integers(0, len(pool) - 1), max_size=80))
    parts = draw(st.lists(st.integers(0, 2**31 - 1) | st.integers(0, 15), min_size=len(picks), max_size=len(picks)))
    return [pool[i] for i in picks], parts


# ----------------------------------------------------------------------------- known vectors

# Values printed by OpenJDK 17.0.15 (`new String(b, UTF_8).hashCode()`, `Arrays.hashCode(b)`).
JVM_HASHES = {
    b"": (0, 1),
    b"hello": (99162322, 127791473),
    b"polygenelubricants": (-(2**31), 1303011777),  # the classic Integer.MIN_VALUE string
    "😀".encode(): (1772899, 350296),  # U+1F600: surrogate pair D83D DE00
    "é𝄞x".encode(): (61885637, 931076778),
    b"\xed\xa0\x80": (65533, None),  # encoded surrogate: one U+FFFD
    b"\xed\xbf\x41": (2031588, None),  # truncated surrogate + 'A'
    b"\x41\xed\xbf": (67548, None),
    b"\xed\xbf\xbf\xbf": (2097056, None),
    b"\xe0\x80\x80": (65074269, None),  # overlong: three U+FFFD
}

# MurmurHash3_x86_32 reference vectors (seed 0) for 4-byte inputs, i.e. one little-endian
# int; Flink's murmurHash(int) is that value folded to non-negative.
MURMUR3_INT_VECTORS = {0x00000000: 0x2362F9DE, 0xFFFFFFFF: 0x76293B50, 0x87654321: 0xF55B516B}


def _fold(unsigned: int) -> int:
    s = java_int(unsigned)
    return s if s >= 0 else (0 if s == INT_MIN else -s)


def _numba_string_hash(data: bytes) -> int:
    return java_int(_string_hash(np.frombuffer(data, np.uint8) if data else np.zeros(0, np.uint8), 0, len(data)))


def _numba_bytes_hash(data: bytes) -> int:
    return java_int(_bytes_hash(np.frombuffer(data, np.uint8) if data else np.zeros(0, np.uint8), 0, len(data)))


def test_hash_codes_match_jvm_values() -> None:
    assert string_hash_code("Aa") == string_hash_code("BB") == 2112
    for key, (string_hash, bytes_hash) in JVM_HASHES.items():
        assert string_hash_code(java_string(key)) == string_hash, key
        assert _numba_string_hash(key) == string_hash, key
        if bytes_hash is not None:
            assert arrays_hash_code(key) == bytes_hash, key
            assert _numba_bytes_hash(key) == bytes_hash, key


def _murmur_preimage_of_min_value() -> int:
    """The one int whose unfolded murmur is Integer.MIN_VALUE (every step is invertible)."""

    def inv_mix(x: int, shift: int) -> int:  # inverse of x ^= x >>> shift
        y = x
        for _ in range(32 // shift + 1):
            y = x ^ (y >> shift)
        return y & MASK

    def rotr(x: int, n: int) -> int:
        return ((x >> n) | (x << (32 - n))) & MASK

    h = 0x80000000
    h = inv_mix(h, 16)
    h = (h * pow(0xC2B2AE35, -1, 1 << 32)) & MASK
    h = inv_mix(h, 13)
    h = (h * pow(0x85EBCA6B, -1, 1 << 32)) & MASK
    h = inv_mix(h, 16)
    h ^= 4
    h = ((h - 0xE6546B64) * pow(5, -1, 1 << 32)) & MASK
    h = rotr(h, 13)
    h = (h * pow(0x1B873593, -1, 1 << 32)) & MASK
    h = rotr(h, 15)
    return (h * pow(0xCC9E2D51, -1, 1 << 32)) & MASK


def test_murmur_matches_reference_vectors() -> None:
    for code, unfolded in MURMUR3_INT_VECTORS.items():
        assert murmur_hash(java_int(code)) == _fold(unfolded)
        assert _flink_murmur(code) == _fold(unfolded)
    edge = _murmur_preimage_of_min_value()
    assert murmur_hash(java_int(edge)) == 0 and _flink_murmur(edge) == 0  # MIN_VALUE folds to 0
    assert murmur_hash(java_int(edge) ^ 1) != 0


@settings(max_examples=2000, deadline=None)
@given(st.integers(INT_MIN, 2**31 - 1))
def test_compiled_murmur_equals_oracle(code: int) -> None:
    assert _flink_murmur(code & MASK) == murmur_hash(code)


@MANY
@given(st.lists(any_key.filter(lambda k: k is not None), max_size=20))
def test_compiled_hash_codes_equal_oracles(keys: list[bytes]) -> None:
    for key in keys:
        assert _numba_string_hash(key) == string_hash_code(java_string(key))
        assert _numba_bytes_hash(key) == arrays_hash_code(key)


# ----------------------------------------------------------------------------- routing


@MANY
@given(keyed_rows(utf8_keys | st.none()), parallelism())
def test_routing_equals_flink_for_utf8_keys(rows: tuple[list, list[int]], par: tuple[int, int]) -> None:
    keys, parts = rows
    max_p, d = par
    got = consumer_indexes(make_batch(keys, parts), d, max_p)
    assert got.tolist() == [expected_consumer(k, p, max_p, d, "string") for k, p in zip(keys, parts)]


@MANY
@given(keyed_rows(), parallelism(), st.sampled_from(["string", "bytes"]))
def test_routing_equals_flink_for_any_bytes(rows: tuple[list, list[int]], par: tuple[int, int], key_type: str) -> None:
    keys, parts = rows
    max_p, d = par
    got = consumer_indexes(make_batch(keys, parts), d, max_p, key_type=key_type)
    assert got.tolist() == [expected_consumer(k, p, max_p, d, key_type) for k, p in zip(keys, parts)]


@MANY
@given(
    keyed_rows(), parallelism(most_consumers=512), st.sampled_from(["string", "bytes"])
)  # D batches each: keep D modest
def test_partitions_keep_every_row_once_in_order(
    rows: tuple[list, list[int]], par: tuple[int, int], key_type: str
) -> None:
    keys, parts = rows
    max_p, d = par
    batch = make_batch(keys, parts)
    outs = partition_batches(batch, d, max_p, key_type=key_type)
    assert len(outs) == d
    seen: list[int] = []
    consumer_of_key: dict[object, int] = {}
    assert all(out.schema == batch.schema for out in outs)  # extra columns survive
    for i, out in enumerate(outs):
        if not out.num_rows:
            continue
        ids = out.column("offset").to_pylist()
        assert ids == sorted(ids)  # input order kept, hence per-key order
        seen += ids
        for row in ids:
            k = keys[row] if keys[row] is not None else ("null", parts[row])
            assert consumer_of_key.setdefault(k, i) == i  # a key never spans consumers
            assert i == expected_consumer(keys[row], parts[row], max_p, d, key_type)
        assert out.to_pylist() == batch.take(pa.array(ids, pa.int64())).to_pylist()  # rows intact
    assert sorted(seen) == list(range(len(keys)))  # every row exactly once


@SOME
@given(
    keyed_rows(),
    parallelism(),
    st.integers(0, 80),
    st.integers(0, 80),
    st.sampled_from([pa.binary(), pa.large_binary()]),
)
def test_sliced_and_large_binary_keys_route_the_same(
    rows: tuple[list, list[int]], par: tuple[int, int], start: int, length: int, key_type: pa.DataType
) -> None:
    keys, parts = rows
    max_p, d = par
    batch = make_batch(keys, parts)
    full = consumer_indexes(batch, d, max_p)
    sliced = batch.slice(start, length)
    sliced = sliced.set_column(3, "key", sliced.column("key").cast(key_type))
    assert consumer_indexes(sliced, d, max_p).tolist() == full[start : start + length].tolist()
    outs = partition_batches(sliced, d, max_p)
    ids = sorted(itertools.chain.from_iterable(o.column("offset").to_pylist() for o in outs))
    assert ids == list(range(start, min(start + length, len(keys))))


def test_string_typed_key_column_equals_binary() -> None:
    keys = [f"user-{i:08d}" for i in range(500)] + ["é𝄞", ""]
    as_binary = make_batch([k.encode() for k in keys])
    as_string = as_binary.set_column(3, "key", pa.array(keys, pa.string()))
    assert consumer_indexes(as_string, 16).tolist() == consumer_indexes(as_binary, 16).tolist()


# ----------------------------------------------------------------------------- null keys, edges


@SOME
@given(st.lists(st.integers(0, 2**31 - 1) | st.integers(0, 31), max_size=60), parallelism())
def test_all_null_keys_route_by_partition(parts: list[int], par: tuple[int, int]) -> None:
    max_p, d = par
    batch = make_batch([None] * len(parts), parts)
    outs = partition_batches(batch, d, max_p)
    assert len(outs) == d
    for i, out in enumerate(outs):
        if not out.num_rows:
            continue
        for p in out.column("partition").to_pylist():
            assert i == assign_key_to_parallel_operator(p, max_p, d)  # as an Integer key
        ids = out.column("offset").to_pylist()
        assert ids == sorted(ids)
    assert sum(o.num_rows for o in outs) == len(parts)


def test_null_keys_error_policy_and_missing_partition() -> None:
    batch = make_batch([b"a", None, b"b"])
    with pytest.raises(RoutingError, match="null_keys='error'"):
        partition_batches(batch, 4, null_keys="error")
    assert len(partition_batches(make_batch([b"a", b"b"]), 4, null_keys="error")) == 4  # no nulls: fine
    no_partition = batch.drop_columns(["partition"])
    with pytest.raises(RoutingError, match="no 'partition' column"):
        partition_batches(no_partition, 4)
    assert sum(o.num_rows for o in partition_batches(make_batch([b"a"]).drop_columns(["partition"]), 4)) == 1


@pytest.mark.parametrize("d", [1, 3, 128])
def test_empty_batch(d: int) -> None:
    batch = make_batch([])
    outs = partition_batches(batch, d)
    assert len(outs) == d and all(o.num_rows == 0 and o.schema == batch.schema for o in outs)
    assert consumer_indexes(batch, d).shape == (0,)


def test_one_consumer_returns_the_batch() -> None:
    batch = make_batch([b"a", None, b"c"])
    assert partition_batches(batch, 1) == [batch]


@pytest.mark.parametrize(
    ("consumers", "max_parallelism", "message"),
    [
        (0, 128, "consumers must be in"),
        (-1, 128, "consumers must be in"),
        (129, 128, "parallelism <= max_parallelism"),
        (4, 0, "max_parallelism must be in"),
        (4, 32769, "max_parallelism must be in"),
        (4, -128, "max_parallelism must be in"),
        (2.0, 128, "consumers must be an integer"),
        (True, 128, "consumers must be an integer"),
        ("4", 128, "consumers must be an integer"),
        (4, 128.0, "max_parallelism must be an integer"),
        (None, 128, "consumers must be an integer"),
    ],
)
def test_invalid_parallelism_is_rejected(consumers: object, max_parallelism: object, message: str) -> None:
    with pytest.raises(OptionError, match=message):  # a KeyfillError, and a ValueError as before
        partition_batches(make_batch([b"a"]), consumers, max_parallelism)


def test_other_invalid_arguments() -> None:
    batch = make_batch([b"a"])
    with pytest.raises(OptionError, match="key_type"):
        partition_batches(batch, 2, key_type="utf16")
    with pytest.raises(OptionError, match="null_keys"):
        partition_batches(batch, 2, null_keys="zero")
    with pytest.raises(RoutingError, match="no 'key' column"):
        partition_batches(batch.drop_columns(["key"]), 2)
    with pytest.raises(NotARecordBatch):
        partition_batches(pa.Table.from_batches([batch]), 2)
    assert issubclass(RoutingError, ValueError) and issubclass(NotARecordBatch, (KeyfillError, TypeError))
    assert len(partition_batches(batch, np.int64(4), np.int32(128))) == 4  # numpy ints are fine


def test_flink_default_max_parallelism() -> None:
    def round_up_to_power_of_two(x: int) -> int:  # MathUtils.roundUpToPowerOfTwo
        x = x - 1
        for s in (1, 2, 4, 8, 16):
            x |= x >> s
        return x + 1

    for p in range(1, 32769):
        expected = min(max(round_up_to_power_of_two(p + java_div(p, 2)), 128), 32768)
        assert flink_default_max_parallelism(p) == expected
    assert flink_default_max_parallelism(85) == 128 and flink_default_max_parallelism(86) == 256


# ----------------------------------------------------------------------------- real JVM

JAVA_ORACLE = r"""
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.util.*;

public class FlinkRoute {
    // Flink's MathUtils.murmurHash(int), in Java int arithmetic.
    static int murmurHash(int code) {
        code *= 0xcc9e2d51;
        code = Integer.rotateLeft(code, 15);
        code *= 0x1b873593;
        code = Integer.rotateLeft(code, 13);
        code = code * 5 + 0xe6546b64;
        code ^= 4;
        code ^= code >>> 16;
        code *= 0x85ebca6b;
        code ^= code >>> 13;
        code *= 0xc2b2ae35;
        code ^= code >>> 16;
        if (code >= 0) return code;
        else if (code != Integer.MIN_VALUE) return -code;
        else return 0;
    }

    // KeyGroupRangeAssignment.assignKeyToParallelOperator given key.hashCode().
    static int route(int hash, int maxParallelism, int parallelism) {
        int keyGroup = murmurHash(hash) % maxParallelism;
        return keyGroup * parallelism / maxParallelism;
    }

    public static void main(String[] args) throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        StringBuilder out = new StringBuilder();
        String line;
        while ((line = in.readLine()) != null) {
            String[] f = line.split(" ", -1);
            int maxP = Integer.parseInt(f[1]), p = Integer.parseInt(f[2]);
            int hs, hb;
            if (f[0].equals("null")) {
                hs = hb = Integer.valueOf(Integer.parseInt(f[3])).hashCode();
            } else {
                byte[] key = HexFormat.of().parseHex(f[0]);
                hs = new String(key, StandardCharsets.UTF_8).hashCode();
                hb = Arrays.hashCode(key);
            }
            out.append(route(hs, maxP, p)).append(' ').append(route(hb, maxP, p)).append('\n');
        }
        System.out.print(out);
    }
}
"""


def test_matches_a_real_jvm(tmp_path) -> None:
    """Cross-check against real Java semantics (UTF-8 decoding, String/Arrays.hashCode, int
    overflow). Needs a JDK 17+, as Spark does; it fails rather than skips without one."""
    javac, java = shutil.which("javac"), shutil.which("java")
    assert javac and java, "no JDK (javac, java) on PATH: keyfill's tests need Java 17 for Spark anyway"
    (tmp_path / "FlinkRoute.java").write_text(JAVA_ORACLE)
    subprocess.run([javac, "-d", str(tmp_path), str(tmp_path / "FlinkRoute.java")], check=True)

    rng = random.Random(20240607)
    special = [0x41, 0x80, 0x9F, 0xA0, 0xBF, 0xC0, 0xC2, 0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF]
    keys: list[bytes | None] = []
    for i in range(6000):
        kind = i % 5
        if kind == 0:
            keys.append(b"user-%08d" % rng.randrange(10**8))
        elif kind == 1:  # any code points, BMP and beyond
            keys.append(
                "".join(
                    chr(
                        rng.choice(
                            [rng.randrange(0x20, 0x7F), rng.randrange(0xA0, 0xD800), rng.randrange(0xE000, 0x110000)]
                        )
                    )
                    for _ in range(rng.randrange(8))
                ).encode()
            )
        elif kind == 2:
            keys.append(bytes(rng.randrange(256) for _ in range(rng.randrange(12))))
        elif kind == 3:  # malformed-heavy
            keys.append(bytes(rng.choice(special) for _ in range(rng.randrange(10))))
        else:
            keys.append(None if rng.random() < 0.5 else b"")
    parts = [rng.choice([rng.randrange(64), rng.randrange(2**31)]) for _ in keys]
    batch = make_batch(keys, parts)
    combos = [(128, 1), (128, 4), (128, 85), (128, 128), (4096, 16), (4096, 1000), (32768, 7), (32768, 32768)]

    lines = [f"{'null' if k is None else k.hex()} {m} {d} {p}" for m, d in combos for k, p in zip(keys, parts)]
    result = subprocess.run(
        [java, "-cp", str(tmp_path), "FlinkRoute"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    jvm = np.array([list(map(int, row.split())) for row in result.stdout.splitlines()]).reshape(
        len(combos), len(keys), 2
    )
    for c, (m, d) in enumerate(combos):
        assert consumer_indexes(batch, d, m, key_type="string").tolist() == jvm[c, :, 0].tolist(), (m, d)
        assert consumer_indexes(batch, d, m, key_type="bytes").tolist() == jvm[c, :, 1].tolist(), (m, d)
