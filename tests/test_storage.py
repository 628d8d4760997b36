"""The storage contract, run against every backend: a local folder, S3 (SeaweedFS), GCS
(fake-gcs-server) and Azure Blob Storage (Azurite)."""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyfill.testing.servers import use_env
from keygroups.storage import (
    LocalStorage,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    S3Storage,
    Storage,
    StorageError,
    open_storage,
)
from keygroups.storage import local as storage_mod
from keygroups.storage.azure_client import credential_origin
from keygroups.storage.limits import DeadlineExceeded, StoreLimits

REPO = Path(__file__).resolve().parents[1]

# Function-scoped fixtures are fine here: every example works under its own fresh sub-root.
per_example = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Printable ASCII (no '/' or '\\': SeaweedFS turns '\\' into '/') plus some non-ASCII, so
# URL-encoding of keys is exercised; the narrow alphabet makes keys share prefixes often,
# which is where ordering goes wrong ("a-b" sorts before "a/b" though folder walks differ).
_BROAD = [chr(c) for c in range(0x20, 0x7F) if chr(c) not in "/\\"] + list("éü日€")
segment = st.one_of(
    st.text(alphabet=st.sampled_from("ab-. é"), min_size=1, max_size=3),
    st.text(alphabet=st.sampled_from(_BROAD), min_size=1, max_size=12),
).filter(lambda s: s not in (".", "..") and not s.startswith(".keyfill-tmp-"))
keys = st.lists(segment, min_size=1, max_size=4).map("/".join)


def prefix_free(ks: list[str]) -> list[str]:
    """Drop keys that are another key's folder: a local store cannot hold 'a' and 'a/b'."""
    return [k for k in ks if not any(o.startswith(k + "/") for o in ks)]


@pytest.fixture
def store(any_store_url: str) -> Storage:
    return open_storage(any_store_url)


def fresh(store: Storage) -> Storage:
    return store.sub(f"ex-{uuid.uuid4().hex[:10]}")


# --------------------------------------------------------------------------- round trips


@per_example
@given(contents=st.dictionaries(keys, st.binary(max_size=3000), min_size=1, max_size=6))
def test_round_trip_and_listing(store: Storage, contents: dict[str, bytes]) -> None:
    s = fresh(store)
    contents = {k: contents[k] for k in prefix_free(list(contents))}
    for key, data in contents.items():
        s.write(key, data)
    for key, data in contents.items():
        assert s.read(key) == data
        assert s.size(key) == len(data)
        assert s.exists(key)
    assert s.list() == [ObjectInfo(k, len(contents[k])) for k in sorted(contents)]
    assert s.delete_prefix("") == len(contents)
    assert s.list() == []


@per_example
@given(key=keys, first=st.binary(max_size=2000), second=st.binary(max_size=2000))
def test_overwrite_replaces(store: Storage, key: str, first: bytes, second: bytes) -> None:
    s = fresh(store)
    s.write(key, first)
    s.write(key, second)
    assert s.read(key) == second
    assert s.list() == [ObjectInfo(key, len(second))]


@per_example
@given(data=st.binary(max_size=5000), start=st.integers(0, 6000), length=st.integers(0, 6000))
def test_read_range(store: Storage, data: bytes, start: int, length: int) -> None:
    s = fresh(store)
    s.write("blob", data)
    assert s.read_range("blob", start, length) == data[start : start + length]


def test_read_range_edges(store: Storage) -> None:
    data = bytes(range(256)) * 40
    store.write("d/blob", data)
    for start, length in [
        (0, 1),
        (0, len(data)),
        (len(data) - 1, 10),
        (len(data), 5),
        (len(data) + 100, 5),
        (1000, 0),
        (4095, 2),
    ]:
        assert store.read_range("d/blob", start, length) == data[start : start + length]
    store.write("d/empty", b"")
    assert store.read_range("d/empty", 0, 10) == b""
    with pytest.raises(ValueError):
        store.read_range("d/blob", -1, 5)
    with pytest.raises(ObjectNotFound):
        store.read_range("d/missing", 0, 0)


# --------------------------------------------------------------------------- listing and deletes


LAYOUT = {"a/1": b"x", "a/2/x": b"yy", "a/2/y": b"", "ab": b"zzz", "a2": b"w", "a-z": b"-", "b/c/d/e": b"q"}


def test_list_by_prefix_sorted_recursive(store: Storage) -> None:
    for key, data in LAYOUT.items():
        store.write(key, data)

    def keys_of(prefix: str) -> list[str]:
        infos = store.list(prefix)
        assert [i.key for i in infos] == sorted(i.key for i in infos)
        assert all(i.size == len(LAYOUT[i.key]) for i in infos)
        return [i.key for i in infos]

    assert keys_of("") == sorted(LAYOUT)
    assert keys_of("a/") == ["a/1", "a/2/x", "a/2/y"]
    assert keys_of("a") == ["a-z", "a/1", "a/2/x", "a/2/y", "a2", "ab"]  # string prefix, like S3
    assert keys_of("a/2") == ["a/2/x", "a/2/y"]
    assert keys_of("a/2/x") == ["a/2/x"]
    assert keys_of("b/c/") == ["b/c/d/e"]
    assert keys_of("nope/") == []
    assert keys_of("a/1/") == []


def test_exists_size_delete(store: Storage) -> None:
    store.write("dir/k", b"12345")
    assert store.exists("dir/k") and store.size("dir/k") == 5
    assert not store.exists("dir")  # a folder is not an object
    assert not store.exists("dir/other")
    store.delete("dir/k")
    assert not store.exists("dir/k")
    with pytest.raises(ObjectNotFound):
        store.size("dir/k")
    store.delete("dir/k")  # missing: not an error
    store.delete("never/was")
    store.write("dir/sub/x", b"1")
    store.delete("dir/sub")  # a folder is not an object either
    store.delete("dir/sub/x/y")
    assert store.read("dir/sub/x") == b"1"


@pytest.mark.parametrize("base_bytes", [0, 1000, (5 << 20) + 7])  # below and above S3's smallest part
@pytest.mark.parametrize("data_bytes", [0, 3, (5 << 20) + 11])
def test_write_after_is_base_then_data_and_leaves_base(store: Storage, base_bytes: int, data_bytes: int) -> None:
    import random

    rng = random.Random(base_bytes * 31 + data_bytes)
    base, data = rng.randbytes(base_bytes), rng.randbytes(data_bytes)
    store.write("g/tail", base)
    store.write("g/new", b"old bytes")  # replaced whole
    store.write_after("g/new", "g/tail", data)
    assert store.read("g/new") == base + data and store.read("g/tail") == base
    assert [o.key for o in store.list("g/")] == ["g/new", "g/tail"]


def test_write_after_a_missing_base_names_it_and_writes_nothing(store: Storage) -> None:
    with pytest.raises(ObjectNotFound, match="gone/tail"):
        store.write_after("g/new", "gone/tail", b"data")
    assert store.list("") == []


def test_delete_prefix(store: Storage) -> None:
    for key, data in LAYOUT.items():
        store.write(key, data)
    assert store.delete_prefix("a/") == 3
    assert [i.key for i in store.list()] == ["a-z", "a2", "ab", "b/c/d/e"]
    assert store.delete_prefix("a/") == 0
    assert store.delete_prefix("b") == 1
    assert [i.key for i in store.list()] == ["a-z", "a2", "ab"]
    if isinstance(store, LocalStorage):  # emptied folders go too, as on S3
        assert sorted(os.listdir(store.root)) == ["a-z", "a2", "ab"]
    store.write("a/again", b"1")  # the pruned folder can be written to again
    assert store.read("a/again") == b"1"


def test_listing_and_deleting_past_one_page(store: Storage) -> None:
    """S3 lists 1000 keys per page and deletes 1000 per request: cross both limits. GCS and
    Azure list 1,000 and 5,000 a page: pages of 100 cross theirs with fewer objects, and 300
    cross Azure's batch of 256 deletes."""
    n = 1003
    if hasattr(store, "list_page"):
        store.list_page, n = 100, 300
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: store.write(f"many/{i:04d}", b"x"), range(n)))
    store.write("manz", b"y")
    assert [i.key for i in store.list("many/")] == [f"many/{i:04d}" for i in range(n)]
    assert store.delete_prefix("many/") == n
    assert [i.key for i in store.list()] == ["manz"]


# --------------------------------------------------------------------------- sub stores


def test_sub(store: Storage) -> None:
    s = store.sub("p/q")
    assert s.url == store.url + "/p/q"
    assert s.url_for("k/v") == store.url + "/p/q/k/v"
    s.write("k/v", b"data")
    assert store.read("p/q/k/v") == b"data"
    assert [i.key for i in store.list()] == ["p/q/k/v"]
    assert s.list() == [ObjectInfo("k/v", 4)]
    assert s.sub("k").read("v") == b"data"
    assert store.sub("p/").sub("q").read("k/v") == b"data"
    assert store.sub("") is store
    assert s.delete_prefix("") == 1 and store.list() == []
    if not isinstance(store, LocalStorage):
        assert s._client is store._client  # one connection pool for the family


# --------------------------------------------------------------------------- errors


def test_not_found_names_url(store: Storage) -> None:
    url = store.url_for("no/such/key")
    for op in (
        lambda: store.read("no/such/key"),
        lambda: store.read_range("no/such/key", 0, 10),
        lambda: store.size("no/such/key"),
    ):
        with pytest.raises(ObjectNotFound) as info:
            op()
        assert url in str(info.value)
    assert not store.exists("no/such/key")
    assert store.list("no/such/") == []


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/", "../up", "a/../b", "a/./b", "x/.keyfill-tmp-123", "nul\x00"])
def test_invalid_keys(store: Storage, key: str) -> None:
    with pytest.raises(ValueError):
        store.write(key, b"x")
    with pytest.raises(ValueError):
        store.read(key)


@pytest.mark.parametrize("url", ["hdfs://nn:8020/data", "ftp://host/x", "adl://store/x"])
def test_unknown_scheme(url: str) -> None:
    with pytest.raises(StorageError) as info:
        open_storage(url)
    assert url in str(info.value)


def test_file_url_with_one_slash_is_the_local_path(tmp_path) -> None:
    assert open_storage(f"file:{tmp_path}").url == str(tmp_path)


@pytest.mark.parametrize(
    "env,message",
    [
        ({"KEYFILL_S3_READ_TIMEOUT": "60"}, "must exceed"),
        ({"KEYFILL_S3_DEADLINE": "inf"}, "less than a day"),
        ({"KEYFILL_S3_CONNECT_TIMEOUT": "soon"}, "number of seconds"),
    ],
)
def test_s3_limits_that_would_disable_retries_or_never_end_are_refused(monkeypatch, env, message) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(StorageError, match=message) as info:
        open_storage("s3://bucket/x")
    assert list(env)[0] in str(info.value)


@pytest.mark.parametrize("url", ["s3a://bucket/x/y", "S3N://bucket/x/y/", "s3://bucket/x/y"])
def test_spark_spellings_of_s3_are_the_same_store(url: str) -> None:
    store = open_storage(url)
    assert isinstance(store, S3Storage) and store.url == "s3://bucket/x/y"


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix", "s3://b/a//c", "s3://b/../x", "file://otherhost/x"])
def test_malformed_url(url: str) -> None:
    with pytest.raises(StorageError) as info:
        open_storage(url)
    assert url in str(info.value)


def test_url_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert open_storage(f"file://{tmp_path}/a%20b").url == f"{tmp_path}/a b"
    assert open_storage(f"{tmp_path}/x/").url == f"{tmp_path}/x"
    monkeypatch.chdir(tmp_path)
    rel = open_storage("rel/dir")
    assert rel.url == f"{tmp_path}/rel/dir"
    rel.write("k", b"v")
    assert (tmp_path / "rel/dir/k").read_bytes() == b"v"
    for url, root in [("s3://b", "s3://b"), ("s3://b/", "s3://b"), ("s3://b/p/q/", "s3://b/p/q")]:
        s3 = open_storage(url)
        assert isinstance(s3, S3Storage) and s3.url == root
        assert s3.url_for("k") == root + "/k"


@pytest.mark.parametrize(
    "server,bucket_url,word",
    [
        ("s3_server", "s3://keyfill-no-such-bucket", "bucket"),
        ("gcs_server", "gs://keyfill-no-such-bucket", "bucket"),
        ("azure_server", "az://keyfill-no-such-container", "container"),
    ],
)
def test_missing_bucket(request: pytest.FixtureRequest, server: str, bucket_url: str, word: str) -> None:
    request.getfixturevalue(server)
    s = open_storage(bucket_url + "/some/prefix")
    ops = [
        lambda: s.read("k"),
        lambda: s.read_range("k", 0, 4),
        lambda: s.write("k", b"x"),
        lambda: s.create("k", b"x"),
        lambda: s.write_after("k", "base", b"x"),
        lambda: s.list(),
        lambda: s.exists("k"),
        lambda: s.size("k"),
        lambda: s.delete("k"),
        lambda: s.delete_prefix(""),
    ]
    for op in ops:
        with pytest.raises(StorageError) as info:
            op()
        assert not isinstance(info.value, ObjectNotFound)
        assert bucket_url in str(info.value) and word in str(info.value)
    # ...and the failed write did not create it behind our back.
    with pytest.raises(StorageError):
        open_storage(bucket_url).list()


def test_unreachable_endpoint_names_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard port: refused
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    s = open_storage("s3://bucket/p")
    with pytest.raises(StorageError) as info:
        s.read("k")
    assert "s3://bucket/p/k" in str(info.value)


# --------------------------------------------------------------------------- S3 client setup


def test_s3_client_config(s3_server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    s = open_storage(f"s3://{s3_server.bucket}/cfg", threads=32)
    assert isinstance(s, S3Storage)
    meta = s.client.meta
    assert meta.endpoint_url == s3_server.endpoint  # AWS_ENDPOINT_URL honoured
    assert meta.region_name == "us-east-1"  # default when none is configured
    assert meta.config.max_pool_connections >= 32
    assert meta.config.retries["mode"] == "standard"
    assert meta.config.retries["total_max_attempts"] >= 5
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    monkeypatch.setenv("AWS_RETRY_MODE", "adaptive")
    meta = open_storage(f"s3://{s3_server.bucket}/cfg").client.meta
    assert meta.region_name == "eu-west-3"
    assert meta.config.retries == {"mode": "adaptive", "total_max_attempts": 3}


class _FakeRaw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, *args: object, **kwargs: object):
        yield self.body


@pytest.mark.parametrize("status,code", [(503, "SlowDown"), (500, "InternalError")])
def test_s3_retries_throttling_and_5xx(s3_url: str, status: int, code: str) -> None:
    from botocore.awsrequest import AWSResponse

    s = open_storage(s3_url)
    assert isinstance(s, S3Storage)
    s.write("k", b"payload")
    failures = {"left": 2}

    def fail_first(request, **kwargs):
        if failures["left"]:
            failures["left"] -= 1
            body = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
            return AWSResponse(request.url, status, {}, _FakeRaw(body))
        return None

    s.client.meta.events.register("before-send.s3.GetObject", fail_first)
    try:
        assert s.read("k") == b"payload"
    finally:
        s.client.meta.events.unregister("before-send.s3.GetObject", fail_first)
    assert failures["left"] == 0


def test_large_objects_go_up_as_multipart_parts(s3_url: str) -> None:
    s = open_storage(s3_url)
    assert isinstance(s, S3Storage)
    s.multipart_bytes = 5 << 20  # S3's smallest part
    big = os.urandom(12 << 20)
    s.write("big", big)
    s.write("small", big[: 1 << 20])
    head = s.client.head_object(Bucket=s.bucket, Key=s._name("big"))
    assert head["ETag"].strip('"').endswith("-3")  # three parts: 5 + 5 + 2 MiB
    assert "-" not in s.client.head_object(Bucket=s.bucket, Key=s._name("small"))["ETag"]
    assert s.read("big") == big and s.size("big") == len(big)
    assert s.read_range("big", (5 << 20) - 3, 6) == big[(5 << 20) - 3 : (5 << 20) + 3]
    s.write("big", big[::-1])  # replaced whole
    assert s.read("big") == big[::-1]


def test_a_failed_multipart_upload_names_the_object(s3_server) -> None:
    s = open_storage(f"s3://no-such-bucket-{os.getpid()}/p")
    assert isinstance(s, S3Storage)
    s.multipart_bytes = 5 << 20
    with pytest.raises(StorageError) as info:
        s.write("big", bytes(6 << 20))
    assert "no-such-bucket" in str(info.value)


# --------------------------------------------------------------------------- pickling


def test_pickle_round_trip(store: Storage) -> None:
    store.write("k", b"before")
    copy = pickle.loads(pickle.dumps(store))
    assert type(copy) is type(store) and copy.url == store.url
    assert copy.read("k") == b"before"
    copy.write("k", b"after")
    assert store.read("k") == b"after"
    if not isinstance(copy, LocalStorage):
        assert copy.sub("x")._client is copy._client
        # Spark tasks in one worker each unpickle a store: they share one SDK client
        # (100-200 ms to build), where the stores made here keep their own
        again = pickle.loads(pickle.dumps(store))
        assert again.client is copy.client and copy.client is not store.client
        assert again.read("k") == b"after"


def test_pickle_into_fresh_process(store: Storage) -> None:
    """What Spark does: ship the store to a new Python process that inherits the env."""
    store.write("in", b"from parent")
    script = (
        "import pickle, sys\ns = pickle.loads(sys.stdin.buffer.read())\ns.write('out', s.read('in') + b' and child')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", script], input=pickle.dumps(store), env=env, check=True, timeout=60)
    assert store.read("out") == b"from parent and child"


# --------------------------------------------------------------------------- concurrency


def test_16_threads(store: Storage, caplog: pytest.LogCaptureFixture) -> None:
    s = open_storage(store.url, threads=16)
    barrier = threading.Barrier(16)

    def work(t: int) -> int:
        barrier.wait()
        for i in range(12):
            data = f"{t}-{i}-".encode() * (i + 1)
            s.write(f"t{t:02d}/{i:02d}", data)
            assert s.read(f"t{t:02d}/{i:02d}") == data
            assert s.read_range(f"t{t:02d}/{i:02d}", 1, 3) == data[1:4]
            assert s.exists(f"t{t:02d}/{i:02d}")
        return len(s.list(f"t{t:02d}/"))

    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        with ThreadPoolExecutor(16) as pool:
            assert list(pool.map(work, range(16))) == [12] * 16
    assert len(s.list()) == 16 * 12
    # boto3's default pool of 10 would log "Connection pool is full, discarding connection".
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]


@pytest.mark.parametrize("trial", range(3))
def test_of_writers_racing_to_create_a_key_exactly_one_wins(store: Storage, trial: int) -> None:
    s = fresh(open_storage(store.url, threads=16))
    barrier = threading.Barrier(16)

    def race(t: int) -> bool:
        barrier.wait()
        try:
            s.create("v/1.json", f"writer {t}".encode() * (t + 1))
        except ObjectExists as e:
            assert s.url_for("v/1.json") in str(e)
            return False
        return True

    with ThreadPoolExecutor(16) as pool:
        won = [t for t, ok in enumerate(pool.map(race, range(16))) if ok]
    assert len(won) == 1
    assert s.read("v/1.json") == f"writer {won[0]}".encode() * (won[0] + 1)  # the winner's bytes, whole
    assert [o.key for o in s.list()] == ["v/1.json"]  # no temp file left behind
    with pytest.raises(ObjectExists):
        s.create("v/1.json", b"late")
    s.create("v/2.json", b"next")
    assert s.read("v/2.json") == b"next"


def test_a_create_repeated_with_its_own_bytes_succeeds_and_other_bytes_are_refused(store: Storage) -> None:
    """An SDK retries a create whose answer was lost; the retry finds the object its first
    attempt made. That is this writer's win, not another's: a commit must not call itself
    failed when its version is visible."""
    s = fresh(store)
    s.create("v/1.json", b"run a")
    s.create("v/1.json", b"run a")
    with pytest.raises(ObjectExists):
        s.create("v/1.json", b"run b")
    assert s.read("v/1.json") == b"run a" and [o.key for o in s.list()] == ["v/1.json"]


def test_listings_carry_each_object_s_last_modified_time(store: Storage) -> None:
    s = fresh(store)
    before = time.time() * 1000
    s.write("a", b"1")
    [info] = s.list()
    # S3 reports whole seconds: allow the second the write started in, and clock skew of 5 s
    assert before - 6_000 <= info.modified_ms <= time.time() * 1000 + 5_000


def test_readers_never_see_partial_writes(store: Storage) -> None:
    old, new = b"o" * 1_500_000, b"n" * 1_300_000
    store.write("hot", old)
    stop = threading.Event()
    seen: set[bytes] = set()

    def reader() -> None:
        while not stop.is_set():
            data = store.read("hot")
            assert data in (old, new), f"partial read of {len(data)} bytes"
            seen.add(data[:1])

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(reader) for _ in range(3)]
        for i in range(400):  # at least 12 replacements, and on until reads saw both versions
            store.write("hot", new if i % 2 == 0 else old)
            if i >= 11 and len(seen) == 2:
                break
        stop.set()
        for f in futures:
            f.result()
    assert seen == {b"o", b"n"}  # the reads overlapped the replacements: the check above was exercised
    assert [i.key for i in store.list()] == ["hot"]


# --------------------------------------------------------------------------- local atomicity


@pytest.mark.parametrize("fail_at", ["write", "fsync", "replace"])
@pytest.mark.parametrize("existing", [True, False])
def test_local_write_failure_leaves_nothing_visible(
    local_url: str, monkeypatch: pytest.MonkeyPatch, fail_at: str, existing: bool
) -> None:
    s = open_storage(local_url)
    if existing:
        s.write("dir/k", b"old contents")

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    if fail_at == "write":  # the data write itself fails partway
        real_open = open

        class Failing:
            def __init__(self, f) -> None:
                self.f = f

            def __enter__(self):
                return self

            def __exit__(self, *exc: object) -> None:
                self.f.close()

            def write(self, data: bytes) -> int:
                self.f.write(data[: len(data) // 2])
                raise OSError(28, "No space left on device")

            def __getattr__(self, name: str):
                return getattr(self.f, name)

        monkeypatch.setattr(storage_mod, "open", lambda *a, **k: Failing(real_open(*a, **k)), raising=False)
    else:
        monkeypatch.setattr(storage_mod.os, fail_at, boom)
    with pytest.raises(StorageError) as info:
        s.write("dir/k", b"new contents that never land" * 100)
    monkeypatch.undo()
    assert s.url_for("dir/k") in str(info.value) and "No space" in str(info.value)
    if existing:
        assert s.read("dir/k") == b"old contents"
        assert s.list() == [ObjectInfo("dir/k", 12)]
        assert os.listdir(os.path.join(local_url, "dir")) == ["k"]
    else:
        assert s.list() == [] and not s.exists("dir/k")
        assert os.listdir(os.path.join(local_url, "dir")) == []


def test_local_temp_files_hidden(local_url: str) -> None:
    """A writer killed mid-write (no chance to clean up) leaves a temp file: never listed."""
    s = open_storage(local_url)
    s.write("dir/k", b"1")
    Path(local_url, "dir", ".keyfill-tmp-deadbeef").write_bytes(b"half")
    assert s.list() == [ObjectInfo("dir/k", 1)]
    assert s.list("dir/.keyfill") == []


def test_local_file_and_folder_clash(local_url: str) -> None:
    s = open_storage(local_url)
    s.write("a", b"1")
    with pytest.raises(StorageError) as info:
        s.write("a/b", b"2")
    assert s.url_for("a/b") in str(info.value)


def test_local_delete_never_reaches_through_a_symlinked_folder(tmp_path) -> None:
    outside = tmp_path / "other"
    outside.mkdir()
    (outside / "precious.avro").write_bytes(b"keep")
    store = open_storage(str(tmp_path / "store"))
    store.write("a/x", b"1")
    os.symlink(outside, tmp_path / "store" / "slices")
    assert [o.key for o in store.list()] == ["a/x", "slices/precious.avro"]
    with pytest.raises(StorageError, match="outside"):
        store.delete_many([o.key for o in store.list()])
    assert (outside / "precious.avro").read_bytes() == b"keep"
    assert store.read("a/x") == b"1"  # nothing deleted when any key is refused


# --------------------------------------------------------------------------- GCS and Azure URLs


@pytest.mark.parametrize(
    "url,root,location",
    [
        ("gs://b/p/q/", "gs://b/p/q", ("gs", "b", "p", "q")),
        ("GCS://b", "gs://b", ("gs", "b")),
        ("az://c/p", "az://c/p", ("azure", "acct", "c", "p")),
        (
            "abfss://c@acct.dfs.core.windows.net/p/",
            "abfss://c@acct.dfs.core.windows.net/p",
            ("azure", "acct", "c", "p"),
        ),
        ("wasbs://c@other.blob.core.chinacloudapi.cn/p", None, ("azure", "other", "c", "p")),
        ("abfs://c/p", "abfs://c/p", ("azure", "acct", "c", "p")),
    ],
)
@pytest.mark.parametrize(
    "env",
    [
        {"AZURE_STORAGE_ACCOUNT": "acct"},
        {"AZURE_STORAGE_CONNECTION_STRING": "AccountName=acct;AccountKey=a2V5"},
        {
            "AZURE_STORAGE_CONNECTION_STRING": "BlobEndpoint=https://acct.blob.core.windows.net/;SharedAccessSignature=sv=1"
        },
    ],
)
def test_cloud_url_forms(
    monkeypatch: pytest.MonkeyPatch, url: str, root: str | None, location: tuple, env: dict[str, str]
) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if location[0] == "azure" and location[1] != "acct" and "AZURE_STORAGE_CONNECTION_STRING" in env:
        with pytest.raises(StorageError, match="AZURE_STORAGE_CONNECTION_STRING is for 'acct'"):
            open_storage(url)  # the URL names another account than the credentials
        return
    store = open_storage(url)
    assert store.location() == location
    assert store.url == (root or url)
    assert store.sub("k").url == store.url + "/k"
    # the Hadoop spellings and az:// of one account and container are one place
    if location[0] == "azure" and location[1] == "acct":
        from keygroups.storage import overlapping

        assert overlapping(store, open_storage("az://c/p/inner"))
        assert not overlapping(store, open_storage("az://c/p-other"))


@pytest.mark.parametrize(
    "url,env,message",
    [
        ("az://c/p", {}, "AZURE_STORAGE_ACCOUNT"),
        ("abfss://c@acct.queue.core.windows.net", {}, "dfs.core.windows.net"),
        ("abfss://c@acct.dfs.core.windows.net/p", {"AZURE_STORAGE_CONNECTION_STRING": "AccountName=other;"}, "other"),
        ("gs://", {}, "no bucket"),
        ("gs://b/a//c", {}, "invalid"),
        ("gs://b/p?sig=secret", {}, "credentials come from the environment"),
        ("az://c@/p", {}, None),
    ],
)
def test_malformed_cloud_urls(monkeypatch: pytest.MonkeyPatch, url: str, env: dict, message: str | None) -> None:
    for var in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(StorageError) as info:
        open_storage(url)
    assert url in str(info.value)
    if message:
        assert message in str(info.value)


def test_a_wrong_azure_key_is_access_denied_naming_the_url(azure_server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Azurite checks shared-key signatures as Azure does: a wrong key is a one-line denial."""
    from keyfill.testing.azurite import ACCOUNT_KEY

    wrong = azure_server.connection_string.replace(ACCOUNT_KEY, "A" * 86 + "==")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", wrong)
    s = open_storage(f"az://{azure_server.container}/denied")
    for op in (lambda: s.read("k"), lambda: s.write("k", b"x"), lambda: s.list()):
        with pytest.raises(StorageError) as info:
            op()
        assert "access denied" in str(info.value) and f"az://{azure_server.container}/denied" in str(info.value)


def test_an_expired_azure_sas_is_named_with_its_expiry(azure_server, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SAS with a short life ends in the middle of a long run: the denial names the object,
    where the credential came from and when it expired, in one line."""
    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

    from keyfill.testing.azurite import ACCOUNT, ACCOUNT_KEY

    store = open_storage(f"az://{azure_server.container}/sas")
    store.write("k", b"x")
    expired = datetime.now(timezone.utc) - timedelta(minutes=1)
    sas = generate_account_sas(
        ACCOUNT,
        ACCOUNT_KEY,
        ResourceTypes(service=True, container=True, object=True),
        AccountSasPermissions(read=True, list=True),
        expired,
    )
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING", f"BlobEndpoint={azure_server.endpoint};SharedAccessSignature={sas}"
    )
    with pytest.raises(StorageError) as info:
        open_storage(f"az://{azure_server.container}/sas").read("k")
    message = str(info.value)
    assert "\n" not in message and f"az://{azure_server.container}/sas/k" in message
    assert "a SAS in AZURE_STORAGE_CONNECTION_STRING that expired at " in message, message
    later = (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", f"BlobEndpoint=x;SharedAccessSignature=se={later}&sp=r")
    assert credential_origin() == f"a SAS in AZURE_STORAGE_CONNECTION_STRING that expires at {later}"


@pytest.mark.parametrize("backend", ["s3", "gcs", "azure"])
def test_a_body_cut_short_or_stalled_is_fetched_again_or_reported_never_returned_short(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """A ranged GET whose body the network resets after 100 KB, or stops sending: cut once,
    it is fetched again and the bytes are right; every time, or stalled, the read fails
    with a StorageError naming the object (once an AttributeError from the S3 layer), and
    never hands back fewer bytes than asked for. The failures under short limits (1 s reads,
    3 s deadline), so they come in seconds; the read that must succeed under the defaults, so
    a busy machine's slowness cannot fail it. Through a `FaultProxy` in front of the emulator."""
    from keyfill.testing.tcp_proxy import in_front_of

    server = request.getfixturevalue(f"{backend}_server")
    url = request.getfixturevalue(f"{backend}_url")
    data = os.urandom(3 << 20)
    open_storage(url).write("obj", data)
    proxy, env = in_front_of(server)
    with proxy:
        use_env(monkeypatch, env)
        proxy.cut(100_000, "reset", times=1)
        assert open_storage(url).read_range("obj", 1_000, 2 << 20) == data[1_000 : 1_000 + (2 << 20)]
        monkeypatch.setenv("KEYFILL_STORAGE_READ_TIMEOUT", "1")
        monkeypatch.setenv("KEYFILL_STORAGE_DEADLINE", "3")
        store = open_storage(url)
        for how in ("reset", "stall"):
            proxy.cut(100_000, how, times=20)
            with pytest.raises(StorageError) as err:
                store.read_range("obj", 1_000, 2 << 20)
            assert f"{url}/obj" in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("backend", ["s3", "azure"])
def test_a_store_that_stops_answering_gives_up_at_its_deadline_with_one_error_class(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """No answer at all (a `FaultProxy` that holds every connection): the attempts stop at
    KEYFILL_STORAGE_DEADLINE, and S3 and Azure give up with the same error class,
    `keygroups.storage.limits.DeadlineExceeded`, behind the one line naming the object.
    (GCS's client has a deadline of its own over its retries: the body test above.)"""
    from keyfill.testing.tcp_proxy import in_front_of

    server = request.getfixturevalue(f"{backend}_server")
    url = request.getfixturevalue(f"{backend}_url")
    open_storage(url).write("obj", b"x" * 1000)
    proxy, env = in_front_of(server)
    with proxy:
        use_env(monkeypatch, env)
        monkeypatch.setenv("KEYFILL_STORAGE_CONNECT_TIMEOUT", "1")
        monkeypatch.setenv("KEYFILL_STORAGE_READ_TIMEOUT", "1")
        monkeypatch.setenv("KEYFILL_STORAGE_DEADLINE", "3")
        store = open_storage(url)
        proxy.stall()
        with pytest.raises(StorageError) as err:
            store.read("obj")
        proxy.resume()
    assert isinstance(err.value, DeadlineExceeded), type(err.value)  # the store's own, naming the object
    message = str(err.value)
    assert f"{url}/obj" in message and "gave up after" in message and "\n" not in message, message


@settings(max_examples=500, deadline=None)
@given(
    read=st.floats(0.1, 30),
    extra=st.floats(0.01, 120),
    elapsed=st.floats(0, 200),
    backoff=st.floats(0, 60),
    sent=st.integers(0, 1 << 30),
)
def test_a_retry_waits_no_longer_than_leaves_it_time_to_finish(read, extra, elapsed, backoff, sent) -> None:
    """The rule every store's retry loop asks before it sleeps: a wait of at most the SDK's
    backoff after which an attempt still ends by the deadline (one more second per MiB sent),
    and no wait at all, but the request's end, when no attempt begun now could."""
    limits = StoreLimits(read_s=read, deadline_s=read + extra)
    wait = limits.retry_wait(0.0, elapsed, backoff, sent)
    assert (wait is None) == (not limits.allows_retry(0.0, elapsed, sent))
    if wait is not None:
        assert 0 <= wait <= backoff
        assert elapsed + wait + read <= limits.deadline_s + sent / (1 << 20) + 1e-9
        assert wait == backoff or elapsed + wait + read == pytest.approx(limits.deadline_s + sent / (1 << 20))


def test_s3_and_azure_retry_loops_end_at_the_deadline_not_a_backoff_past_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both SDKs' own retry handlers, as keyfill configures them, asked what to do after a
    failed attempt of a request that started long enough ago: with no time left for another
    attempt, the request ends there with DeadlineExceeded (botocore and azure-storage-blob
    would sleep their backoff first, and only then find the deadline passed); with a little
    left, the wait is cut to it (botocore's ninth backoff is up to 12.8 s, Azure's 20 s)."""
    from botocore.exceptions import EndpointConnectionError

    from keygroups.storage.azure_client import _retry_policy

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("KEYFILL_STORAGE_READ_TIMEOUT", "1")
    monkeypatch.setenv("KEYFILL_STORAGE_DEADLINE", "3")
    client = open_storage("s3://bucket/p").client  # type: ignore[attr-defined]
    operation = client.meta.service_model.operation_model("GetObject")

    def s3_wait(started: float, attempts: int) -> float:
        _, wait = client.meta.events.emit_until_response(
            "needs-retry.s3.GetObject",
            response=None,
            endpoint=None,
            operation=operation,
            attempts=attempts,
            caught_exception=EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
            request_dict={"context": {"keyfill_started": started}, "url": "http://127.0.0.1:9/bucket/p/k"},
        )
        return wait

    class Clock:
        waited: list[float] = []

        def sleep(self, seconds: float) -> None:
            self.waited.append(seconds)

    azure = _retry_policy(StoreLimits(read_s=1, deadline_s=3))

    def azure_wait(started: float, count: int) -> float:
        context = {"keyfill_started": started, "keyfill_url": "http://127.0.0.1:9/account/c/k"}
        Clock.waited.clear()
        azure.sleep({"count": count, "keyfill_context": context}, Clock())
        return sum(Clock.waited)

    for wait in (s3_wait, azure_wait):
        with pytest.raises(DeadlineExceeded, match=r"gave up after [23] s and 8 attempt\(s\) on .*127\.0\.0\.1:9"):
            wait(time.monotonic() - 2.5, 8)  # 0.5 s left: less than a 1 s read
        for attempts in range(6, 12):
            assert 0 <= wait(time.monotonic() - 1.9, attempts) <= 0.1

    # the attempt a wait was cut for is sent, though the clock has passed where a new one may start
    class Sent:
        def __init__(self, context: dict) -> None:
            self.context, self.headers, self.url = context, {}, "http://127.0.0.1:9/bucket/p/k"

    context = {"keyfill_started": time.monotonic() - 1.95}
    _, waited = client.meta.events.emit_until_response(
        "needs-retry.s3.GetObject",
        response=None,
        endpoint=None,
        operation=operation,
        attempts=9,
        caught_exception=EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
        request_dict={"context": context, "url": "http://127.0.0.1:9/bucket/p/k"},
    )
    context["retries"] = {"attempt": 10}
    time.sleep(waited + 0.1)
    client.meta.events.emit("before-send.s3.GetObject", request=Sent(context))  # not refused
    context["retries"] = {"attempt": 11}
    with pytest.raises(DeadlineExceeded):  # one past it is
        client.meta.events.emit("before-send.s3.GetObject", request=Sent(context))


def test_missing_cloud_credentials_are_named_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in (
        "STORAGE_EMULATOR_HOST",
        "AZURE_STORAGE_CONNECTION_STRING",
        "AZURE_STORAGE_KEY",
        "AZURE_STORAGE_SAS_TOKEN",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", "keyfillnoaccount")
    for url, words in [("gs://b/p", "no Google credentials"), ("az://c/p", "no Azure credentials")]:
        with pytest.raises(StorageError) as info:
            open_storage(url).read("k")
        message = str(info.value)
        assert url in message and words in message and "\n" not in message
