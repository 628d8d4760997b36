"""What every cloud does daily, on every store: bursts of 429 and 503, with and without
Retry-After, answered by an `HttpFaultProxy` (keyfill/testing/http_faults.py) in front of
the emulator (SeaweedFS, fake-gcs-server, Azurite). A burst shorter than the retries is
retried and the bytes are right; a store that answers 503 to everything fails the read in
one line naming the object, at its deadline; a replay through a few 503s delivers every
record once. A body that trickles in is read whole however long it takes, as long as no
wait passes the read timeout, and one that stops fails the read in one line; an expired
credential fails in one line naming where it came from, after a few requests at most.
Compactions, appends, the audit and the Spark source under these faults:
tests/test_http_fault_runs.py."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import reader
from compactor.job import CompactConfig, compact
from keyfill.testing.http_faults import HttpFaultProxy, Match, in_front_of
from keyfill.testing.servers import use_env
from keygroups.storage import StorageError, open_storage
from keygroups.storage.limits import DeadlineExceeded
from tests.test_faults import source, source_records

pytestmark = [pytest.mark.stores, pytest.mark.faults]  # each store behind a fault proxy

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
        # 3 s: the deadline, not botocore's attempt count, must end it (at 5 s S3 ran out of attempts first)
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


# A body that stops is fetched again by every store's client: S3 (keyfill's loop) and Azure
# (the SDK's downloader) make three requests, each waiting the read timeout for bytes, GCS
# retries until its deadline. So the read fails within 3 x (deadline + read timeout), 15 s
# here; measured 2-8 s. The bound below is three times that: the busy 2-core box.
STOPPED_BOUND_S = 3 * 3 * (3 + 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_trickling_body_is_read_whole_and_one_that_stops_fails_in_one_line(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Side by side, through short limits (2 s reads, 3 s deadline): a body sent 50 KB every
    0.4 s takes longer than the deadline and is read whole (the read timeout bounds each wait
    for bytes, not a transfer: five times each wait, room for a busy machine); one sent 50 KB
    every 6 s, so each wait passes the read timeout, fails naming the object in one line and
    hands back no bytes."""
    url = request.getfixturevalue(f"{backend}_url")
    data = os.urandom(500_000)
    open_storage(url).write("steady", data)
    open_storage(url).write("stopped", data)
    with proxied(request, monkeypatch, backend) as proxy:
        monkeypatch.setenv("KEYFILL_STORAGE_READ_TIMEOUT", "2")
        monkeypatch.setenv("KEYFILL_STORAGE_DEADLINE", "3")
        store = open_storage(url)
        proxy.trickle(50_000, 0.4, times=100, match=get_of("steady"))
        proxy.trickle(50_000, 6.0, times=100, match=get_of("stopped"))
        started = time.monotonic()

        def timed(read: Callable[[], bytes]) -> tuple[bytes, float]:
            return read(), time.monotonic() - started

        with ThreadPoolExecutor(2) as pool:
            steady = pool.submit(timed, lambda: store.read("steady"))
            stopped = pool.submit(timed, lambda: store.read_range("stopped", 0, 400_000))
            with pytest.raises(StorageError) as err:
                stopped.result()
            failed_after = time.monotonic() - started
            got, took = steady.result()
            assert got == data
    message = str(err.value)
    assert f"{url}/stopped" in message and "\n" not in message, message
    assert failed_after < STOPPED_BOUND_S, f"{failed_after:.1f} s: {message}"
    assert took > 3  # the steady body outlasted the deadline: the trickle was in the path
    print(f"{backend}: read a trickle whole in {took:.1f} s; a stopped body failed in {failed_after:.1f} s: {message}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_expired_credential_fails_in_one_line_naming_its_origin_without_a_retry_storm(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """The emulators' keys never expire: the proxy answers as each store does when a session
    token or SAS has ended (S3 400 ExpiredToken, GCS 401 Invalid Credentials, Azure 403
    AuthenticationFailed). A read, a write and a listing each fail in one line naming the
    store's URL and where the credential came from, after at most three requests."""
    url = request.getfixturevalue(f"{backend}_url")
    open_storage(url).write("obj", b"x" * 1000)
    origin = {
        "s3": "the shared credentials file (AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials), profile keyfill",
        "gcs": "anonymous credentials (STORAGE_EMULATOR_HOST=http://127.0.0.1:",
        "azure": "AZURE_STORAGE_CONNECTION_STRING",
    }[backend]
    with proxied(request, monkeypatch, backend) as proxy:
        if backend == "s3":  # the keys from a profile of a credentials file, not the environment
            shared = Path(request.getfixturevalue("tmp_path")) / "credentials"
            shared.write_text(
                f"[keyfill]\naws_access_key_id = {os.environ['AWS_ACCESS_KEY_ID']}\n"
                f"aws_secret_access_key = {os.environ['AWS_SECRET_ACCESS_KEY']}\n"
            )
            use_env(monkeypatch, {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_PROFILE": "keyfill"})
            monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(shared))
        store = open_storage(url)
        assert store.read("obj") == b"x" * 1000  # the credential works until it expires
        proxy.expire_credentials(times=100, match=lambda method, path: True)
        for key, op in [
            ("obj", lambda: store.read("obj")),
            ("new", lambda: store.write("new", b"y")),
            ("", store.list),
        ]:
            before = proxy.failed
            with pytest.raises(StorageError) as err:
                op()
            message = str(err.value)
            assert store.url_for(key) in message and origin in message and "\n" not in message, message
            assert 1 <= proxy.failed - before <= 3, f"{proxy.failed - before} requests: {message}"
    print(f"{backend}: {message}")


def test_an_expired_google_service_account_token_is_refreshed_then_named(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Real credentials, not the emulator's anonymous ones: a service-account key whose
    token endpoint is a server of the test's (fake-gcs-server as GCS through the proxy,
    API_ENDPOINT_OVERRIDE instead of STORAGE_EMULATOR_HOST, so the client authenticates).
    GCS answers 401 Invalid Credentials to every request: google-auth fetches a new token
    and tries again, twice, then the read fails in one line naming the key's file and
    account. Three requests and two token fetches, not a storm."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    url = request.getfixturevalue("gcs_url")
    open_storage(url).write("obj", b"x" * 1000)
    tokens = token_server()
    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    account = "keyfill-test@project.iam.gserviceaccount.com"
    key = tmp_path / "key.json"
    key.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "project",
                "private_key_id": "1",
                "private_key": pem.decode(),
                "client_email": account,
                "client_id": "1",
                "token_uri": f"http://127.0.0.1:{tokens.server_address[1]}/token",
            }
        )
    )
    with proxied(request, monkeypatch, "gcs") as proxy:
        monkeypatch.setenv("API_ENDPOINT_OVERRIDE", os.environ["STORAGE_EMULATOR_HOST"])
        monkeypatch.delenv("STORAGE_EMULATOR_HOST")
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
        store = open_storage(url)
        assert store.read("obj") == b"x" * 1000
        fetched = tokens.fetched
        proxy.expire_credentials(times=100, match=lambda method, path: True)
        with pytest.raises(StorageError) as err:
            store.read("obj")
        refused, refreshed = proxy.failed, tokens.fetched - fetched
    tokens.shutdown()
    message = str(err.value)
    assert f"{url}/obj" in message and "\n" not in message and "GCS refused" in message, message
    assert f"a service-account key of {account} in GOOGLE_APPLICATION_CREDENTIALS={key}" in message, message
    assert (refused, refreshed) == (3, 2), message


def test_a_gcs_read_sends_its_request_alone(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """google-cloud-storage 3.17 GETs a bucket's metadata, from a thread it starts on a
    client's first call, to label OpenTelemetry spans. keyfill turns that off while the
    SDK's traces are off: a new client's read starts no thread and sends one request (the
    thread's 401s once took part in a read's credential refreshes, above)."""
    url = request.getfixturevalue("gcs_url")
    open_storage(url).write("obj", b"x" * 10)
    caller, started = threading.current_thread(), []
    start = threading.Thread.start

    def recorded(thread: threading.Thread) -> None:
        if threading.current_thread() is caller:
            started.append(thread.name)
        start(thread)

    with proxied(request, monkeypatch, "gcs") as proxy:
        monkeypatch.delenv("ENABLE_GCS_PYTHON_CLIENT_OTEL_TRACES", raising=False)
        store = open_storage(url)  # the proxy's address is a new client's
        with monkeypatch.context() as patch:
            patch.setattr(threading.Thread, "start", recorded)
            assert store.read("obj") == b"x" * 10
        assert (started, proxy.forwarded) == ([], 1)


class _Tokens(ThreadingHTTPServer):
    fetched = 0


def token_server() -> _Tokens:
    """An OAuth token endpoint on 127.0.0.1 that grants every request a token for an hour."""

    class Grant(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            server.fetched += 1
            body = json.dumps({"access_token": f"token-{server.fetched}", "expires_in": 3600, "token_type": "Bearer"})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = _Tokens(("127.0.0.1", 0), Grant)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server
