"""What every cloud does daily, on every store: bursts of 429 and 503, with and without
Retry-After, answered by an `HttpFaultProxy` (keyfill/testing/http_faults.py) in front of
the emulator (SeaweedFS, fake-gcs-server, Azurite). A burst shorter than the retries is
retried and the bytes are right; a store that answers 503 to everything fails the read in
one line naming the object, at its deadline; a replay through a few 503s delivers every
record once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

import reader
from compactor.job import CompactConfig, compact
from keyfill.testing.http_faults import HttpFaultProxy, Match, in_front_of
from keyfill.testing.servers import use_env
from keygroups.storage import StorageError, open_storage
from keygroups.storage.limits import DeadlineExceeded
from tests.test_faults import source, source_records

__all__ = ["source"]  # test_faults' module fixture, the generated topic: a fixture of this module too

BACKENDS = ["s3", "gcs", "azure"]


@contextmanager
def proxied(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, backend: str) -> Iterator[HttpFaultProxy]:
    """The store's SDK routed through an HttpFaultProxy for the test (its server's own
    variables first: test_faults' frozen_s3 points the process at a SeaweedFS of its own)."""
    server = request.getfixturevalue(f"{backend}_server")
    use_env(monkeypatch, server.env())
    proxy, env = in_front_of(server)
    with proxy:
        use_env(monkeypatch, env)
        yield proxy


def get_of(name: str) -> Match:
    return lambda method, path: method == "GET" and path.endswith(f"/{name}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_burst_of_503_or_429_shorter_than_the_retries_is_retried_and_read_whole(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Two 503s before a ranged read, two 429s with Retry-After: 1 before a whole one (side
    by side, each burst on its own object): both return the object's bytes. (azure-storage-
    blob's own retry policy hands a 429 back at once; keyfill's Azure client retries it.)"""
    url = request.getfixturevalue(f"{backend}_url")
    data = os.urandom(300_000)
    open_storage(url).write("ranged", data)
    open_storage(url).write("whole", data[::-1])
    with proxied(request, monkeypatch, backend) as proxy:
        store = open_storage(url)
        proxy.fail(503, times=2, match=get_of("ranged"))
        proxy.fail(429, times=2, retry_after=1, match=get_of("whole"))
        with ThreadPoolExecutor(2) as pool:
            ranged = pool.submit(store.read_range, "ranged", 1_000, 100_000)
            whole = pool.submit(store.read, "whole")
            assert ranged.result() == data[1_000:101_000]
            assert whole.result() == data[::-1]
        assert proxy.failed == 4 and proxy.faults_left == 0  # answered by the proxy: it is in the path
        assert proxy.forwarded >= 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_503_to_every_request_fails_the_read_at_the_deadline_in_one_line_naming_the_object(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Ends (pytest-timeout's bound, not a timed one) with the stores' one DeadlineExceeded, in
    one line naming the object."""
    url = request.getfixturevalue(f"{backend}_url")
    open_storage(url).write("obj", b"x" * 1000)
    with proxied(request, monkeypatch, backend) as proxy:
        monkeypatch.setenv("KEYFILL_STORAGE_READ_TIMEOUT", "1")
        monkeypatch.setenv("KEYFILL_STORAGE_DEADLINE", "3")
        store = open_storage(url)
        proxy.fail(503, times=1_000)
        with pytest.raises(StorageError) as err:
            store.read_range("obj", 10, 100)
        assert proxy.failed >= 2  # retried before giving up
    message = str(err.value)
    assert f"{url}/obj" in message and "\n" not in message, message
    assert isinstance(err.value, DeadlineExceeded) and "gave up after" in message, message  # one class, every store
    print(f"{backend}, 503 to every request ({proxy.failed} answered): {message}")


@pytest.fixture(scope="module")
def archive(source, tmp_path_factory) -> str:
    """test_faults' archive (the same topic and settings), compacted in this process: the
    same files as on Spark, without a Spark session's start."""
    dest = str(tmp_path_factory.mktemp("http-faults") / "c")
    compact(CompactConfig(source=source, dest=dest, groups=4, slice_duration="20s", codec="null"))
    return dest


def segment_get(method: str, path: str) -> bool:
    return method == "GET" and "/groups/" in path and path.endswith(".avro")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_replay_through_503s_on_its_segment_reads_delivers_each_record_once(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, archive: str, source: str, backend: str
) -> None:
    url = request.getfixturevalue(f"{backend}_url")
    use_env(monkeypatch, request.getfixturevalue(f"{backend}_server").env())
    remote, local = open_storage(url), open_storage(archive)
    for o in local.list():
        remote.write(o.key, local.read(o.key))
    with proxied(request, monkeypatch, backend) as proxy:
        proxy.fail(503, times=3, match=segment_get)
        got = []
        with reader.replay(url, threads=3) as events:
            for ev in events:
                if isinstance(ev, reader.Records):
                    got += zip(ev.batch.column("partition").to_pylist(), ev.batch.column("offset").to_pylist())
        assert proxy.failed == 3 and proxy.faults_left == 0  # the first three segment reads were refused
    assert len(got) == len(set(got)) and set(got) == set(source_records(source, archive))
